"""copy_pages: the torch reference against hand-written rows, Triton (interpreter) against the reference,
the argument checks, and one launch per call."""

import pytest
import torch
from support.kernels import assert_same_bits

from atom.bench.kernel_count import KernelCounter
from atom.kernels.backend import OPS, get_kernel, value_checks_off
from atom.kernels.page_copy import copy_pages, copy_pages_reference, word_bytes

FNS = [copy_pages, copy_pages_reference]
IDS = ["triton", "torch"]


def pages(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def byte_table(num_pages: int, page_bytes: int, gen: torch.Generator, *, pitch: int | None = None,
               offset: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """(flat buffer of random bytes, ``[num_pages, page_bytes]`` view at ``offset`` with rows ``pitch`` apart)."""
    pitch = pitch or page_bytes
    buf = torch.randint(0, 256, (offset + num_pages * pitch + 3,), generator=gen, dtype=torch.uint8)
    return buf, buf[offset:offset + num_pages * pitch].view(num_pages, pitch)[:, :page_bytes]


@pytest.mark.parametrize("fn", FNS, ids=IDS)
def test_each_listed_page_lands_on_its_destination_and_nothing_else_changes(fn):
    src = torch.arange(4 * 6, dtype=torch.uint8).view(4, 6)
    dst = torch.full((5, 6), 0xEE, dtype=torch.uint8)
    fn(src, pages(2, 0, 2), dst, pages(4, 1, 0))
    assert dst[4].tolist() == [12, 13, 14, 15, 16, 17]
    assert dst[1].tolist() == [0, 1, 2, 3, 4, 5]
    assert dst[0].tolist() == [12, 13, 14, 15, 16, 17]
    assert dst[2].tolist() == [0xEE] * 6 and dst[3].tolist() == [0xEE] * 6


@pytest.mark.parametrize("page_bytes, pitch, offset, word", [
    (37, 41, 3, 1),  # odd sizes: byte words, a page not a multiple of any tile
    (4100, 4102, 2, 2),  # 2-byte aligned: int16 words, 2050 per page (one partial tile)
    (4500, 4500, 0, 4),  # int32 words, 1125 words per page
    (5000 * 8, 5000 * 8 + 64, 8, 8),  # int64 words, 5000 per page: two width tiles of 4096, the second partial
])
def test_triton_equals_the_reference_on_random_scattered_pages(page_bytes, pitch, offset, word, gen):
    n_src, n_dst, n = 90, 80, 70  # 70 copies: two page groups of 64 in the interpreter, the second partial
    src_buf, src = byte_table(n_src, page_bytes, gen, pitch=pitch, offset=offset)
    got_buf, got = byte_table(n_dst, page_bytes, gen, pitch=pitch, offset=offset)
    want_buf = got_buf.clone()
    want = want_buf[offset:offset + n_dst * pitch].view(n_dst, pitch)[:, :page_bytes]
    src_pages = torch.randint(0, n_src, (n,), generator=gen)
    dst_pages = torch.randperm(n_dst, generator=gen)[:n]
    assert word_bytes(src, got) == word
    copy_pages(src, src_pages, got, dst_pages)
    copy_pages_reference(src, src_pages, want, dst_pages)
    assert_same_bits(got_buf, want_buf)
    for s, d in zip(src_pages.tolist()[:5], dst_pages.tolist()[:5]):
        assert torch.equal(got[d], src[s])


@pytest.mark.parametrize("fn", FNS, ids=IDS)
def test_copies_within_one_view_between_disjoint_pages(fn, gen):
    _, table = byte_table(10, 24, gen)
    before = table.clone()
    fn(table, pages(1, 2, 3), table, pages(7, 8, 0))
    assert torch.equal(table[7], before[1]) and torch.equal(table[8], before[2]) and torch.equal(table[0], before[3])
    assert torch.equal(table[1:7], before[1:7]) and torch.equal(table[9], before[9])


@pytest.mark.parametrize("fn", FNS, ids=IDS)
def test_an_empty_copy_order_writes_nothing(fn, gen):
    _, src = byte_table(3, 8, gen)
    _, dst = byte_table(3, 8, gen)
    before = dst.clone()
    fn(src, pages(), dst, pages())
    assert torch.equal(dst, before)


def test_one_call_is_one_launch_whatever_the_number_of_pages(gen):
    _, src = byte_table(200, 48, gen)
    _, dst = byte_table(200, 48, gen)
    src_pages, dst_pages = torch.randperm(200, generator=gen)[:130], torch.randperm(200, generator=gen)[:130]
    with value_checks_off(), KernelCounter() as count:
        copy_pages(src, src_pages, dst, dst_pages)
    assert (count.triton, sum(count.aten.values())) == (1, 0)
    assert torch.equal(dst[dst_pages], src[src_pages])


def test_the_registry_gives_the_reference_on_torch_and_the_kernel_on_triton():
    assert OPS["copy_pages"] == ("page_copy", "copy_pages", "copy_pages_reference")
    assert get_kernel("copy_pages", "torch") is copy_pages_reference
    assert get_kernel("copy_pages", "triton") is copy_pages


def _good():
    return dict(src=torch.zeros(4, 16, dtype=torch.uint8), src_pages=pages(0, 3),
                dst=torch.zeros(6, 16, dtype=torch.uint8), dst_pages=pages(5, 1))


BAD_CASES = {
    "src is not bytes": ("src", lambda a: a["src"].float(), "uint8"),
    "dst is 1-D": ("dst", lambda a: torch.zeros(96, dtype=torch.uint8), "2-D"),
    "dst inner dim strided": ("dst", lambda a: torch.zeros(6, 32, dtype=torch.uint8)[:, ::2], "contiguous"),
    "page sizes differ": ("dst", lambda a: torch.zeros(6, 8, dtype=torch.uint8), "bytes"),
    "src_pages int32": ("src_pages", lambda a: a["src_pages"].int(), "int64"),
    "dst_pages 2-D": ("dst_pages", lambda a: pages(5, 1).view(2, 1), "1-D"),
    "lengths differ": ("dst_pages", lambda a: pages(5, 1, 2), "entries"),
    "src page past the end": ("src_pages", lambda a: pages(0, 4), "src_pages"),
    "negative src page": ("src_pages", lambda a: pages(-1, 3), "src_pages"),
    "dst page past the end": ("dst_pages", lambda a: pages(6, 1), "dst_pages"),
    "dst page repeated": ("dst_pages", lambda a: pages(2, 2), "more than once"),
}


@pytest.mark.parametrize("case", list(BAD_CASES))
@pytest.mark.parametrize("fn", FNS, ids=IDS)
def test_wrapper_rejects_bad_arguments_before_writing(fn, case):
    args = _good()
    name, make, needle = BAD_CASES[case]
    args[name] = make(args)
    before = args["dst"].clone()
    with pytest.raises(ValueError, match=needle):
        fn(args["src"], args["src_pages"], args["dst"], args["dst_pages"])
    assert torch.equal(args["dst"], before)


@pytest.mark.parametrize("fn", FNS, ids=IDS)
def test_a_page_read_and_written_in_one_view_or_overlapping_views_are_refused(fn):
    buf = torch.zeros(8 * 16, dtype=torch.uint8)
    table = buf.view(8, 16)
    with pytest.raises(ValueError, match="reads in the same view"):
        fn(table, pages(1, 2), table, pages(2, 5))
    shifted = buf[8:8 + 7 * 16].view(7, 16)
    with pytest.raises(ValueError, match="overlap in memory"):
        fn(table, pages(0), shifted, pages(3))


@pytest.mark.parametrize("fn", FNS, ids=IDS)
def test_a_source_page_may_be_copied_to_several_destinations(fn):
    src = torch.arange(32, dtype=torch.uint8).view(2, 16)
    dst = torch.zeros(3, 16, dtype=torch.uint8)
    fn(src, pages(1, 1, 1), dst, pages(0, 1, 2))
    assert all(torch.equal(dst[i], src[1]) for i in range(3))
