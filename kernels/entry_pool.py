"""Pooling every compressed entry a step completes, for all sequences at once.

An entry pools ``R`` rows (CSA: 8, the previous block's "b" half and this block's "a" half; HCA:
the block's ``ratio`` rows; which rows is ``Compressor.entry_rows``/``entry_sources``, the one
statement of that rule). A row comes from the step's fresh projections or from a request's state
ring, and from a column window of it::

    row r of entry e:  fresh_row[e, r] = t >= 0 -> kv[t, col[r] : col[r] + width],
                                                 score[t, cols] + ape[positions[t] % ratio, cols]
                       else ring_row[e, r] >= 0 -> ring_kv[ring_row // ring, ring_row % ring, col[r] : ...]
                                                   (same for ring_score: the ring holds scores with ape added)
                       else padding: kv 0, score PAD_SCORE (the lowest finite fp32)
    pooled[e] = sum_r softmax_r(score rows) * kv rows        (per channel, fp32)

A padding row's weight ``exp(PAD_SCORE - max)`` is exactly 0 beside any real row, as ``-inf``'s would be, so
real entries pool to the same bits; an entry of padding rows only (the fixed-size entry lists pad with them, and
``compressed_write`` skips them) pools to 0 instead of ``0 / 0``: no NaN is made, on the GPU or under the
interpreter (where ``-inf - -inf`` is numpy's "invalid value" warning).

The positional bias ``ape`` (``[ratio, W]``) is added to the fresh rows' scores here, with the one fp32 add
``compressor_state_update`` applies on the way into the ring, so a row pools to the same value whether it
is read fresh or from the ring; a caller whose scores already include it passes zeros.

:func:`entry_pool_ref` (torch) and :func:`entry_pool` (Triton: one program per entry and width tile,
the ``R`` rows in registers, max-subtracted softmax) share the contract; the Triton sums may differ
from torch's in the last bits. Index tensors are int32; nothing is read back to the host.
"""

from __future__ import annotations

import torch

from ._common import HAS_TRITON, check_index, check_positive, check_rows, check_same_device, next_pow2, \
    require_triton, triton, tl
from .step_memo import memoized
from .tiles import tiles_for

__all__ = ["entry_pool", "entry_pool_ref", "PAD_SCORE"]

#: a padding row's score: the lowest finite fp32 (module docstring)
PAD_SCORE = float(torch.finfo(torch.float32).min)


def _check(kv, score, ape, positions, ring_kv, ring_score, fresh_row, ring_row, col, width) -> None:
    check_rows("kv", kv, dtype=torch.float32)
    check_rows("score", score, dtype=torch.float32, width=kv.shape[1])
    check_rows("ape", ape, dtype=torch.float32, width=kv.shape[1])
    check_positive("ape.shape[0] (the compress ratio)", ape.shape[0])
    check_index("positions", positions, (kv.shape[0],))
    check_rows("ring_kv", ring_kv, ndim=3, dtype=torch.float32, width=kv.shape[1])
    check_rows("ring_score", ring_score, ndim=3, dtype=torch.float32, width=kv.shape[1])
    if ring_kv.shape != ring_score.shape or kv.shape != score.shape:
        raise ValueError(f"kv/score {tuple(kv.shape)}/{tuple(score.shape)} and ring_kv/ring_score "
                         f"{tuple(ring_kv.shape)}/{tuple(ring_score.shape)} must match pairwise")
    check_index("fresh_row", fresh_row, (None, None))
    check_index("ring_row", ring_row, tuple(fresh_row.shape))
    check_index("col", col, (fresh_row.shape[1],))
    check_positive("width", width)
    if width > kv.shape[1]:
        raise ValueError(f"width {width} exceeds the row width {kv.shape[1]}")
    check_same_device(kv=kv, score=score, ape=ape, positions=positions, ring_kv=ring_kv, ring_score=ring_score,
                      fresh_row=fresh_row, ring_row=ring_row, col=col)


def entry_pool_ref(kv: torch.Tensor, score: torch.Tensor, ape: torch.Tensor, positions: torch.Tensor,
                   ring_kv: torch.Tensor, ring_score: torch.Tensor, fresh_row: torch.Tensor, ring_row: torch.Tensor,
                   col: torch.Tensor, *, width: int) -> torch.Tensor:
    """Torch reference of :func:`entry_pool` (same contract)."""
    _check(kv, score, ape, positions, ring_kv, ring_score, fresh_row, ring_row, col, width)
    cols, fresh, pad, fresh_at, slot_at, ring_at, ape_at = _pool_index(positions, fresh_row, ring_row, col, width,
                                                                       ring_kv.shape[1], ape.shape[0])

    def rows(new: torch.Tensor, ring_src: torch.Tensor) -> torch.Tensor:
        return torch.where(fresh, new, ring_src[slot_at, ring_at, cols])

    bias = ape[ape_at, cols]
    k = rows(kv[fresh_at, cols], ring_kv).masked_fill(pad, 0.0)
    s = rows(score[fresh_at, cols] + bias, ring_score).masked_fill(pad, PAD_SCORE)
    return (k * s.softmax(dim=-2)).sum(dim=-2)


@memoized
def _pool_index(positions: torch.Tensor, fresh_row: torch.Tensor, ring_row: torch.Tensor, col: torch.Tensor,
                width: int, ring: int, ratio: int) -> tuple[torch.Tensor, ...]:
    """The gather indices of :func:`entry_pool_ref`: (columns ``[1, R, width]``, fresh / pad masks ``[E, R, 1]``,
    fresh row, ring slot, ring row and ape row ``[E, R, 1]``). Index arithmetic only, the same for every layer
    of one compressor geometry in a step (:mod:`.step_memo`)."""
    cols = (col.long()[:, None] + torch.arange(width, device=col.device))[None]  # [1, R, width]
    fresh = (fresh_row >= 0)[..., None]
    pad = ((fresh_row < 0) & (ring_row < 0))[..., None]
    f, rr = fresh_row.long().clamp(min=0), ring_row.long().clamp(min=0)
    ape_at = (positions.long()[f] % ratio)[..., None]
    return cols, fresh, pad, f[..., None], (rr // ring)[..., None], (rr % ring)[..., None], ape_at


if HAS_TRITON:

    @triton.jit
    def _entry_pool_kernel(kv_ptr, score_ptr, ape_ptr, pos_ptr, rkv_ptr, rscore_ptr, fresh_ptr, ring_ptr, col_ptr,
                           out_ptr, num_rows, width, ring, ratio, kv_stride, ape_stride, rkv_s0, rkv_s1, out_stride,
                           BLOCK_R: tl.constexpr, BLOCK_W: tl.constexpr):
        e = tl.program_id(0)
        w = tl.program_id(1) * BLOCK_W + tl.arange(0, BLOCK_W)
        r = tl.arange(0, BLOCK_R)
        in_r = r < num_rows
        fresh = tl.load(fresh_ptr + e * num_rows + r, mask=in_r, other=-1)
        rr = tl.load(ring_ptr + e * num_rows + r, mask=in_r, other=-1)
        c = tl.load(col_ptr + r, mask=in_r, other=0)
        is_fresh = fresh >= 0
        is_ring = (fresh < 0) & (rr >= 0)
        col = c[:, None] + w[None, :]
        ok_w = (w < width)[None, :]
        f_off = fresh.to(tl.int64)[:, None] * kv_stride + col
        rc = tl.maximum(rr, 0)
        r_off = (rc // ring).to(tl.int64)[:, None] * rkv_s0 + (rc % ring).to(tl.int64)[:, None] * rkv_s1 + col
        mf = is_fresh[:, None] & ok_w
        mr = is_ring[:, None] & ok_w
        k = tl.load(kv_ptr + f_off, mask=mf, other=0.0) + tl.load(rkv_ptr + r_off, mask=mr, other=0.0)
        # the fresh row's ape row: pos % ratio, floored (a negative position reads a valid row, as torch's %)
        pos = tl.load(pos_ptr + tl.maximum(fresh, 0), mask=is_fresh, other=0)
        a_off = ((pos % ratio + ratio) % ratio).to(tl.int64)[:, None] * ape_stride + col
        s_f = tl.load(score_ptr + f_off, mask=mf, other=0.0) + tl.load(ape_ptr + a_off, mask=mf, other=0.0)
        s_r = tl.load(rscore_ptr + r_off, mask=mr, other=0.0)
        s = tl.where(mf, s_f, tl.where(mr, s_r, -3.4028234663852886e38))  # PAD_SCORE
        s = tl.where(ok_w, s, 0.0)  # columns past the width: finite, never stored
        m = tl.max(s, axis=0)
        p = tl.exp(s - m[None, :])
        out = tl.sum(p * k, axis=0) / tl.sum(p, axis=0)
        tl.store(out_ptr + e * out_stride + w, out, mask=w < width)


def entry_pool(kv: torch.Tensor, score: torch.Tensor, ape: torch.Tensor, positions: torch.Tensor,
               ring_kv: torch.Tensor, ring_score: torch.Tensor, fresh_row: torch.Tensor, ring_row: torch.Tensor,
               col: torch.Tensor, *, width: int) -> torch.Tensor:
    """Pooled rows ``[E, width]`` of the entries described by ``fresh_row``/``ring_row``/``col`` (module docstring).

    Args:
        kv, score: fp32 ``[T, W]`` the step's fresh compressor rows (score without the positional bias).
        ape: fp32 ``[ratio, W]`` positional bias, added to a fresh row's score as ``ape[pos % ratio]``
            (zeros when ``score`` already includes it).
        positions: int32 ``[T]`` the position of each fresh row's token.
        ring_kv, ring_score: fp32 ``[num_slots, ring, W]`` the state rings (inner dim contiguous).
        fresh_row, ring_row: int32 ``[E, R]``: the fresh row, else the flat ring row ``slot * ring + i``,
            else (both -1) a padding row.
        col: int32 ``[R]`` first column of each row's window; width: the pooled width (``<= W``).
    """
    _check(kv, score, ape, positions, ring_kv, ring_score, fresh_row, ring_row, col, width)
    require_triton("entry_pool")
    if ring_kv.stride(1) != ring_score.stride(1) or ring_kv.stride(0) != ring_score.stride(0) \
            or kv.stride(0) != score.stride(0):
        raise ValueError("kv/score and ring_kv/ring_score must have the same strides")
    num_entries, num_rows = fresh_row.shape
    out = torch.empty(num_entries, width, dtype=torch.float32, device=kv.device)
    if num_entries == 0:
        return out
    bw = min(next_pow2(width), tiles_for(kv.device).entry_pool_width)
    grid = (num_entries, triton.cdiv(width, bw))
    _entry_pool_kernel[grid](kv, score, ape, positions, ring_kv, ring_score, fresh_row, ring_row, col, out, num_rows,
                             width, ring_kv.shape[1], ape.shape[0], kv.stride(0), ape.stride(0), ring_kv.stride(0),
                             ring_kv.stride(1), out.stride(0), BLOCK_R=next_pow2(num_rows), BLOCK_W=bw)
    return out
