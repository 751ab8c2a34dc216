"""Compiled Triton kernels against the torch references on a GPU, at real DSV4-Flash row geometry.

Skipped on machines without CUDA/ROCm. Run in its own session (``pytest tests/gpu``): the CPU kernel
tests set ``TRITON_INTERPRET=1`` for the whole process, and these tests must exercise compiled code.
"""


import pytest
import torch

from support.gpu import gpu_module_marks

pytestmark = gpu_module_marks("the CPU tests in tests/kernels cover the same kernels in the interpreter")


DEV = "cuda"
BS, ROW_STRIDE, WINDOW, D, H = 128, 224, 128, 512, 64


def table(num_seqs, max_blocks, num_pages, gen):
    pages = torch.randperm(num_pages, generator=gen)[:num_seqs * max_blocks].view(num_seqs, max_blocks)
    pages[torch.rand(num_seqs, max_blocks, generator=gen) < 0.2] = -1
    return pages.to(torch.int32).to(DEV)


def same_bits(a, b):
    ints = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.uint8: torch.uint8, torch.int32: torch.int32}
    return torch.equal(a.contiguous().view(ints[a.dtype]), b.contiguous().view(ints[b.dtype]))


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(7)


def test_compressor_state_capture_and_restore_equal_the_references(gen):
    from atom.kernels import compressor_state as cs

    lens = [300, 5, 1024]
    cu = torch.tensor([0, 300, 305, 1329], dtype=torch.int32, device=DEV)
    pos_start = torch.tensor([0, 123, 1024], dtype=torch.int32, device=DEV)
    kv, score = (torch.randn(1329, 2 * D, generator=gen).to(DEV) for _ in range(2))
    ape = torch.randn(4, 2 * D, generator=gen).to(DEV)
    slots = torch.tensor([3, -1, 0], dtype=torch.int32, device=DEV)
    states = [torch.full((4, 8, 2 * D), float("nan"), device=DEV) for _ in range(4)]
    cs.compressor_state_update(kv, score, ape, states[0], states[1], slots, cu, pos_start)
    cs.compressor_state_update_ref(kv, score, ape, states[2], states[3], slots, cu, pos_start)
    assert same_bits(states[0], states[2]) and same_bits(states[1], states[3])
    tab = table(3, 24, 80, gen)
    dst = [torch.full((80, 4, 2 * D), float("nan"), device=DEV) for _ in range(4)]
    cs.csa_boundary_capture(kv, score, ape, dst[0], dst[1], tab, cu, pos_start, block_size=BS)
    cs.csa_boundary_capture_ref(kv, score, ape, dst[2], dst[3], tab, cu, pos_start, block_size=BS)
    assert same_bits(dst[0], dst[2]) and same_bits(dst[1], dst[3])
    both = [torch.full((4, 8, 2 * D), float("nan"), device=DEV) for _ in range(2)] + \
        [torch.full((80, 4, 2 * D), float("nan"), device=DEV) for _ in range(2)]
    cs.csa_state_write(kv, score, ape, both[0], both[1], slots, both[2], both[3], tab, cu, pos_start, pos_start,
                       block_size=BS)  # the update and the capture in one launch: the same bits
    assert all(same_bits(a, b) for a, b in zip(both, (states[2], states[3], dst[2], dst[3])))
    src = torch.tensor([int(tab[0, 1]), 5, -1], dtype=torch.int32, device=DEV)
    resume = torch.tensor([256, 128, 512], dtype=torch.int32, device=DEV)
    fresh = [torch.full((4, 8, 2 * D), float("nan"), device=DEV) for _ in range(4)]
    cs.csa_boundary_restore(dst[0], dst[1], fresh[0], fresh[1], src, slots, resume)
    cs.csa_boundary_restore_ref(dst[2], dst[3], fresh[2], fresh[3], src, slots, resume)
    assert same_bits(fresh[0], fresh[2]) and same_bits(fresh[1], fresh[3])


def test_hca_accumulator_equals_the_reference_and_is_bit_identical_under_any_split(gen):
    from atom.kernels.hca_state import hca_state_update, hca_state_update_ref

    n, ratio = 1000, 128
    kv, score = (torch.randn(n, D, generator=gen).to(DEV) * 3 for _ in range(2))
    ape = torch.randn(ratio, D, generator=gen).to(DEV)

    def run(fn, splits):
        acc = torch.full((2, 3, D), float("nan"), device=DEV)
        pooled, pos = torch.full((n, D), float("nan"), device=DEV), 0
        for k in splits:
            cu = torch.tensor([0, k], dtype=torch.int32, device=DEV)
            start = torch.tensor([pos], dtype=torch.int32, device=DEV)
            out = torch.full((k, D), float("nan"), device=DEV)
            fn(kv[pos:pos + k], score[pos:pos + k], ape, acc, torch.tensor([1], dtype=torch.int32, device=DEV),
               cu, start, out)
            pooled[pos:pos + k] = out
            pos += k
        return pooled, acc[1]

    whole = run(hca_state_update, [n])
    for splits in ([300, 1, 127, 572], [128] * 7 + [104]):
        got = run(hca_state_update, splits)
        assert same_bits(got[0], whole[0]) and same_bits(got[1], whole[1])
    ref = run(hca_state_update_ref, [n])
    torch.testing.assert_close(whole[0], ref[0], rtol=1e-5, atol=1e-5, equal_nan=True)


@pytest.mark.parametrize("group", ["c4", "hca"])
def test_index_builders_equal_the_references(group, gen):
    from atom.kernels.paged_index import build_comp_index, build_comp_index_ref, build_window_index, build_window_index_ref

    ratio = 4 if group == "c4" else 128
    n = 512
    seqs = torch.randint(0, 8, (n,), generator=gen, dtype=torch.int32).to(DEV)
    pos = torch.randint(0, 64 * BS, (n,), generator=gen, dtype=torch.int32).to(DEV)
    topk = None
    if group == "c4":
        vis = ((pos.long() + 1) // ratio).clamp(min=1)
        topk = (torch.rand(n, 512, generator=gen).to(DEV) * vis[:, None]).long().to(torch.int32)
        topk[(pos + 1) // ratio == 0] = -1
    kw = dict(width=512 if group == "c4" else 64, ratio=ratio, entries_per_block=BS // ratio, pages_per_chunk=7,
              chunk_rows=224)
    win = dict(window=WINDOW, block_size=BS, row_stride=ROW_STRIDE)
    swa, comp = table(8, 64, 1024, gen), table(8, 64, 1024, gen)
    assert torch.equal(build_window_index(swa, seqs, pos, **win), build_window_index_ref(swa, seqs, pos, **win))
    assert torch.equal(build_comp_index(comp, seqs, pos, topk, **kw), build_comp_index_ref(comp, seqs, pos, topk, **kw))


@pytest.mark.parametrize("num_tokens", [1, 64])
def test_sparse_attention_equals_the_reference_at_flash_geometry(num_tokens, gen):
    from atom.kernels.sparse_attention import sparse_attention, sparse_attention_ref

    q = torch.randn(num_tokens, H, D, generator=gen).to(torch.bfloat16).to(DEV)
    wrows = torch.randn(4096, D, generator=gen).to(torch.bfloat16).to(DEV)
    crows = torch.randn(8192, D, generator=gen).to(torch.bfloat16).to(DEV)
    widx = torch.randint(-1, 4096, (num_tokens, WINDOW), generator=gen, dtype=torch.int32).to(DEV)
    cidx = torch.randint(-1, 8192, (num_tokens, 512), generator=gen, dtype=torch.int32).to(DEV)
    sink = torch.randn(H, generator=gen).to(DEV)
    got = sparse_attention(q, wrows, widx, crows, cidx, sink, scale=D ** -0.5)
    ref = sparse_attention_ref(q, wrows, widx, crows, cidx, sink, scale=D ** -0.5)
    torch.testing.assert_close(got.float(), ref.float(), rtol=1e-2, atol=1e-2)


def test_fp8_ds_mla_codec_equals_the_reference(gen):
    from atom.kernels.fp8_ds_mla import fp8_ds_mla_dequantize, fp8_ds_mla_quantize, fp8_ds_mla_quantize_ref

    x = (torch.randn(1000, D, generator=gen) * torch.logspace(-5, 4, 1000)[:, None]).to(DEV)
    got, ref = fp8_ds_mla_quantize(x), fp8_ds_mla_quantize_ref(x)
    assert same_bits(got, ref)
    assert same_bits(fp8_ds_mla_dequantize(got), fp8_ds_mla_dequantize(ref))


