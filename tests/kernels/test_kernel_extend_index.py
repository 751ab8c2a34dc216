"""Split prefill window (SWA rows before the chunk, K-tensor rows inside it) and attention over it."""

import pytest
import torch
from support.kernels import arena_rows, assert_same_bits, i32, random_table

from atom.kernels.backend import load_kernels
from atom.kernels.extend_index import build_split_window_index, build_split_window_index_ref

BS, STRIDE, W = 8, 11, 6


def naive_split(table, seqs, positions, cu, starts, window):
    swa, ext = [], []
    for s, p in zip(seqs, positions):
        a, b = [-1] * window, [-1] * window
        if s >= 0 and p >= 0:
            for w, q in enumerate(range(max(0, p - window + 1), p + 1)):
                if q >= starts[s]:
                    b[w] = cu[s] + q - starts[s]
                elif table[s][q // BS] >= 0:
                    a[w] = table[s][q // BS] * STRIDE + q % BS
        swa.append(a)
        ext.append(b)
    return i32(swa), i32(ext)


def test_reference_gives_the_hand_computed_split():
    # one sequence, chunk = positions 10..12 at K rows 4..6; window 4 of position 11: 8, 9 | 10, 11
    got = build_split_window_index_ref(i32([[2, 3]]), i32([0]), i32([11]), i32([4, 7]), i32([10]), window=4,
                                       block_size=BS, row_stride=STRIDE)
    assert got.swa_idx.tolist() == [[3 * STRIDE + 0, 3 * STRIDE + 1, -1, -1]]
    assert got.extend_idx.tolist() == [[-1, -1, 4, 5]]


def test_reference_matches_a_naive_loop(gen):
    table = random_table(3, 5, 16, gen)
    lens, starts = [5, 9, 1], [3, 20, 7]
    cu = [0, 5, 14, 15]
    seqs = i32([s for s, n in enumerate(lens) for _ in range(n)] + [-1])
    positions = i32([starts[s] + j for s, n in enumerate(lens) for j in range(n)] + [-1])
    got = build_split_window_index_ref(table, seqs, positions, i32(cu), i32(starts), window=W, block_size=BS,
                                       row_stride=STRIDE)
    want = naive_split(table.tolist(), seqs.tolist(), positions.tolist(), cu, starts, W)
    assert_same_bits(got.swa_idx, want[0])
    assert_same_bits(got.extend_idx, want[1])
    assert int((got.swa_idx >= 0).sum()) > 0 and int((got.extend_idx >= 0).sum()) > 0


def test_triton_split_equals_the_reference(gen):
    table = random_table(4, 8, 40, gen)
    lens, starts = [17, 1, 30, 6], [0, 33, 9, 50]
    cu = i32([0, 17, 18, 48, 54])
    seqs = i32([s for s, n in enumerate(lens) for _ in range(n)])
    positions = i32([starts[s] + j for s, n in enumerate(lens) for j in range(n)])
    kw = dict(window=W, block_size=BS, row_stride=STRIDE)
    got = build_split_window_index(table, seqs, positions, cu, i32(starts), **kw)
    ref = build_split_window_index_ref(table, seqs, positions, cu, i32(starts), **kw)
    assert_same_bits(got.swa_idx, ref.swa_idx)
    assert_same_bits(got.extend_idx, ref.extend_idx)


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_a_query_outside_its_chunk_is_rejected(backend):
    kern = load_kernels(backend)
    with pytest.raises(ValueError, match="inside their chunk"):
        kern.build_split_window_index(i32([[0, 1]]), i32([0]), i32([3]), i32([0, 2]), i32([5]), window=W,
                                      block_size=BS, row_stride=STRIDE)


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_window_only_prefill_chunks_attend_like_one_contiguous_pass(backend, gen):
    """Chunk 1 is written window-only after its attention; chunk 2 attends its prefix through the SWA rows
    and its own rows through the extend source. Every query equals attention over the contiguous window."""
    kern = load_kernels(backend)
    D, H, n1, n2 = 16, 2, 13, 9
    table = random_table(1, 4, 6, gen, p_missing=0.0)
    keys = torch.randn(n1 + n2, D, generator=gen)
    _, rows = arena_rows(6 * STRIDE, D, torch.float32)
    sink = torch.randn(H, generator=gen)
    got = []
    for start, n in ((0, n1), (n1, n2)):
        cu, pos_start = i32([0, n]), i32([start])
        seqs, pos = i32([0] * n), i32(list(range(start, start + n)))
        idx = kern.build_split_window_index(table, seqs, pos, cu, pos_start, window=W, block_size=BS,
                                            row_stride=STRIDE)
        chunk = keys[start:start + n].contiguous()
        q = torch.randn(n, H, D, generator=gen)
        out = kern.sparse_attention(q, rows, idx.swa_idx, None, None, sink, scale=0.3, extend_rows=chunk,
                                    extend_idx=idx.extend_idx)
        kern.swa_write_prefill(chunk, rows, table, cu, pos_start, block_size=BS, row_stride=STRIDE, window=W)
        got += [(p, q[j], out[j]) for j, p in enumerate(pos.tolist())]
    for p, q, out in got:
        ctx = keys[max(0, p - W + 1):p + 1]
        logits = 0.3 * (q @ ctx.T)
        m = torch.maximum(logits.max(-1).values, sink)
        e = torch.exp(logits - m[:, None])
        want = (e @ ctx) / (e.sum(-1) + torch.exp(sink - m))[:, None]
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-6)
