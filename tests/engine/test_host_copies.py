"""The runner's host copies move whole pages between the arena and the host buffer, byte for byte:
an SWA page with its fused CSA boundary state, a compressed page's rows of every compressed layer and its
indexer keys; nothing else in either buffer changes; stores run before loads."""

import pytest
import torch

from atom.config import CacheConfig, Dsv4KvSpec, SchedulerConfig
from atom.kernels.page_copy import copy_pages_reference
from atom.kv.kv_layout import KvLayout
from atom.kv.page_map import COMPRESS, SWA
from atom.model_executor.host_copies import HostCopies, _spans
from atom.step_contract import HostCopy

SPEC = Dsv4KvSpec(compress_ratios=(0, 4, 16, 4, 16, 4, 0), sliding_window=8, head_dim=32, rope_head_dim=8,
                  index_head_dim=16, row_format="fp32")


def layout(num_chunks=5, chunk_pages=2):
    limits = SchedulerConfig(max_num_batched_tokens=32, max_num_seqs=4, max_model_len=128)
    return KvLayout.for_chunks(SPEC, num_chunks, limits, CacheConfig(chunk_pages=chunk_pages))


def page_bytes(buf: torch.Tensor, lay: KvLayout, owner: str, page: int) -> bytes:
    """Every byte of ``page`` of ``owner`` in ``buf``, span by span (the layout's own offsets)."""
    out = b""
    for span in _spans(lay)[owner]:
        chunk, local = divmod(page, span.pages_per_chunk)
        start = span.offset + chunk * span.chunk_stride + local * span.page_stride
        out += bytes(buf[start:start + span.nbytes].tolist())
    return out


def make(device="cpu", host_chunks=3):
    lay = layout()
    arena = torch.randint(0, 256, (lay.arena_bytes,), dtype=torch.uint8, device=device)
    copies = HostCopies(lay, host_chunks, arena, copy_pages_reference)
    copies.host.copy_(torch.randint(0, 256, copies.host.shape, dtype=torch.uint8))
    return lay, arena, copies


def test_the_spans_of_a_compressed_page_cover_the_compressed_block_bytes():
    lay = layout()
    assert sum(s.nbytes for s in _spans(lay)[COMPRESS]) == SPEC.compressed_block_bytes
    assert _spans(lay)[SWA][0].nbytes == lay.swa_page_bytes


@pytest.mark.parametrize("owner", [SWA, COMPRESS])
def test_a_store_then_a_load_moves_exactly_the_named_pages(owner):
    lay, arena, copies = make()
    n_dev = lay.max_swa_pages if owner == SWA else lay.max_compressed_pages
    src, dst = [1, n_dev - 1, 3], [0, 5, 2]
    before_arena, before_host = arena.clone(), copies.host.clone()
    want = [page_bytes(arena, lay, owner, p) for p in src]
    copies.run((HostCopy(owner, tuple(src), tuple(dst)),), ())
    assert [page_bytes(copies.host, lay, owner, p) for p in dst] == want
    assert torch.equal(arena, before_arena)
    changed = (copies.host != before_host).nonzero().flatten().tolist()
    spans = set()
    for p in dst:
        for s in _spans(lay)[owner]:
            c, l = divmod(p, s.pages_per_chunk)
            start = s.offset + c * s.chunk_stride + l * s.page_stride
            spans.update(range(start, start + s.nbytes))
    assert set(changed) <= spans  # nothing outside the destination pages moved
    copies.run((), (HostCopy(owner, tuple(dst), (4, 0, 2)),))
    assert [page_bytes(arena, lay, owner, p) for p in (4, 0, 2)] == want
    assert copies.pages_moved == 6


def test_the_loads_of_a_batch_read_what_its_stores_wrote():
    lay, arena, copies = make()
    want = page_bytes(arena, lay, SWA, 7)
    copies.run((HostCopy(SWA, (7,), (1,)),), (HostCopy(SWA, (1,), (0,)),))
    assert page_bytes(arena, lay, SWA, 0) == want


def test_a_host_tier_needs_a_whole_chunk():
    lay = layout()
    with pytest.raises(ValueError, match="at least one chunk"):
        HostCopies(lay, 0, torch.zeros(lay.arena_bytes, dtype=torch.uint8), copy_pages_reference)
