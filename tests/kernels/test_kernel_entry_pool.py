"""entry_pool: the reference against a written-out gather and softmax, Triton (interpreter) against the
reference, on rows from the fresh chunk (whose scores get ``ape[pos % ratio]``), from strided rings and from
the padding block."""

import pytest
import torch
from support.kernels import assert_same_bits, i32

from atom.kernels.entry_pool import entry_pool, entry_pool_ref


def case(gen, entries=5, rows=8, width=6, full=12, tokens=9, slots=3, ring=8, ratio=4):
    kv, score = torch.randn(tokens, full, generator=gen), torch.randn(tokens, full, generator=gen)
    ape = torch.randn(ratio, full, generator=gen)
    positions = torch.randint(0, 1000, (tokens,), generator=gen, dtype=torch.int32)
    pool = torch.randn(slots, ring, full + 3, generator=gen)  # rings as a strided view
    ring_kv = pool[:, :, :full]
    ring_score = torch.randn(slots, ring, full + 3, generator=gen)[:, :, :full]
    fresh = torch.randint(-1, tokens, (entries, rows), generator=gen, dtype=torch.int32)
    ring_row = torch.randint(0, slots * ring, (entries, rows), generator=gen, dtype=torch.int32)
    ring_row[fresh >= 0] = -1
    ring_row[0, :3] = -1  # padding rows: kv 0, score -inf
    fresh[0, :3] = -1
    col = i32([0] * (rows // 2) + [full - width] * (rows - rows // 2))
    return kv, score, ape, positions, ring_kv, ring_score, fresh, ring_row, col, width


def written_out(kv, score, ape, positions, ring_kv, ring_score, fresh, ring_row, col, width):
    ring = ring_kv.shape[1]
    out = []
    for e in range(fresh.shape[0]):
        ks, ss = [], []
        for r in range(fresh.shape[1]):
            c0, f, rr = int(col[r]), int(fresh[e, r]), int(ring_row[e, r])
            if f >= 0:
                a = ape[int(positions[f]) % ape.shape[0], c0:c0 + width]
                k, s = kv[f, c0:c0 + width], score[f, c0:c0 + width] + a
            elif rr >= 0:
                k, s = ring_kv[rr // ring, rr % ring, c0:c0 + width], ring_score[rr // ring, rr % ring, c0:c0 + width]
            else:
                k, s = torch.zeros(width), torch.full((width,), float("-inf"))
            ks.append(k)
            ss.append(s)
        k, s = torch.stack(ks), torch.stack(ss)
        out.append((k * torch.softmax(s, dim=0)).sum(0))
    return torch.stack(out)


def test_reference_pools_the_rows_the_indices_name(gen):
    args = case(gen)
    got = entry_pool_ref(*args[:-1], width=args[-1])
    torch.testing.assert_close(got, written_out(*args), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("rows", [8, 16])
def test_triton_equals_the_reference(rows, gen):
    args = case(gen, rows=rows, ring=rows)
    torch.testing.assert_close(entry_pool(*args[:-1], width=args[-1]), entry_pool_ref(*args[:-1], width=args[-1]),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("ratio,tokens,entries", [(4, 9, 5), (4, 1, 3), (8, 23, 7)])
@pytest.mark.parametrize("pool", [entry_pool, entry_pool_ref])
def test_adding_ape_in_the_kernel_equals_scores_that_already_include_it(pool, ratio, tokens, entries, gen):
    """The fold of ``ape`` is one fp32 add per fresh score: bit for bit what a caller adding it first gets,
    on strided fresh rows (columns of one merged projection) at ragged sizes."""
    kv, score, ape, positions, ring_kv, ring_score, fresh, ring_row, col, width = case(
        gen, entries=entries, tokens=tokens, ratio=ratio)
    merged = torch.cat((kv, score), dim=1)  # kv and score as column views of one [T, 2W] GEMM output
    kv_v, score_v = merged[:, :kv.shape[1]], merged[:, kv.shape[1]:]
    folded = pool(kv_v, score_v, ape, positions, ring_kv, ring_score, fresh, ring_row, col, width=width)
    added = score + ape[positions.long() % ratio]
    given = pool(kv, added, torch.zeros_like(ape), positions, ring_kv, ring_score, fresh, ring_row, col, width=width)
    assert_same_bits(folded, given)


def test_bad_arguments_are_rejected(gen):
    kv, score, ape, positions, ring_kv, ring_score, fresh, ring_row, col, width = case(gen)
    with pytest.raises(ValueError, match="ring_row"):
        entry_pool_ref(kv, score, ape, positions, ring_kv, ring_score, fresh, ring_row[:, :4].contiguous(), col,
                       width=width)
    with pytest.raises(ValueError, match="width"):
        entry_pool_ref(kv, score, ape, positions, ring_kv, ring_score, fresh, ring_row, col, width=kv.shape[1] + 1)
    with pytest.raises(ValueError, match="int32"):
        entry_pool(kv, score, ape, positions, ring_kv, ring_score, fresh.long(), ring_row, col, width=width)
    with pytest.raises(ValueError, match="positions"):
        entry_pool(kv, score, ape, positions[:-1].contiguous(), ring_kv, ring_score, fresh, ring_row, col,
                   width=width)
    with pytest.raises(ValueError, match="ape"):
        entry_pool_ref(kv, score, ape[:, :-1].contiguous(), positions, ring_kv, ring_score, fresh, ring_row, col,
                       width=width)
