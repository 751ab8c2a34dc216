"""entry_pool's padding rows: an entry made of padding rows only (the fixed-size entry lists of a step pad with
them) pools to exactly 0 on both backends without computing a NaN (under the interpreter ``-inf - -inf`` was
numpy's "invalid value" warning); beside real rows a padding row weighs nothing, as a ``-inf`` score would."""

import warnings

import torch
from support.kernels import assert_same_bits, i32

from atom.kernels.entry_pool import PAD_SCORE, entry_pool, entry_pool_ref


def padded_case(gen, entries=4, rows=8, width=6, full=10, tokens=7, slots=2, ring=8):
    """Entry 0: padding rows only; entry 1: three padding rows, the rest fresh; the others fresh and ring rows."""
    kv, score = torch.randn(tokens, full, generator=gen), torch.randn(tokens, full, generator=gen)
    ape = torch.randn(4, full, generator=gen)
    positions = torch.arange(tokens, dtype=torch.int32)
    ring_kv = torch.randn(slots, ring, full, generator=gen)
    ring_score = torch.randn(slots, ring, full, generator=gen)
    fresh = torch.randint(-1, tokens, (entries, rows), generator=gen, dtype=torch.int32)
    ring_row = torch.randint(0, slots * ring, (entries, rows), generator=gen, dtype=torch.int32)
    ring_row[fresh >= 0] = -1
    fresh[0], ring_row[0] = -1, -1
    fresh[1, :3], ring_row[1, :3] = -1, -1
    fresh[1, 3:], ring_row[1, 3:] = torch.arange(rows - 3, dtype=torch.int32) % tokens, -1
    col = i32([0] * (rows // 2) + [full - width] * (rows - rows // 2))
    return (kv, score, ape, positions, ring_kv, ring_score, fresh, ring_row, col), width


def test_the_padding_score_is_the_lowest_finite_fp32():
    assert PAD_SCORE == float(torch.finfo(torch.float32).min) and torch.tensor(PAD_SCORE).isfinite()


def test_an_entry_of_padding_rows_only_pools_to_zero_without_a_runtime_warning(gen):
    args, width = padded_case(gen)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # the interpreter's numpy warnings become errors
        got = entry_pool(*args, width=width)
    want = entry_pool_ref(*args, width=width)
    assert_same_bits(got[0], torch.zeros(width))
    assert_same_bits(want[0], torch.zeros(width))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_padding_rows_beside_real_rows_weigh_nothing(gen):
    """Entry 1's pooled row is the softmax over its five fresh rows alone."""
    args, width = padded_case(gen)
    kv, score, ape, positions, _, _, fresh, _, col = args
    t = fresh[1, 3:].long()
    cols = col[3:].long()[:, None] + torch.arange(width)
    k = kv[t[:, None], cols]
    s = score[t[:, None], cols] + ape[positions.long()[t] % ape.shape[0]][torch.arange(len(t))[:, None], cols]
    alone = (k * s.softmax(dim=0)).sum(0)
    for pool in (entry_pool, entry_pool_ref):
        torch.testing.assert_close(pool(*args, width=width)[1], alone, rtol=1e-6, atol=1e-6)
