"""The HCA compressor state as an online softmax accumulator, and the entries it completes.

An HCA layer pools every ``ratio`` consecutive tokens into one entry with a per-dimension softmax
over the block's scores. Instead of keeping the block's ``ratio`` rows of kv and score (a ring of
``2 x ratio x width`` fp32 per request and layer: 512 KiB on V4-Flash), the state is three fp32
rows per request and layer, updated token by token in position order::

    acc[slot, 0] = running max of the scores                      (m, starts at -inf)
    acc[slot, 1] = running sum of exp(score - m)                  (l, starts at 0)
    acc[slot, 2] = running sum of exp(score - m) * kv             (a, starts at 0)

    for each token (score s = score + ape[pos % ratio], row kv):
        m' = max(m, s);  c = exp(m - m');  p = exp(s - m')
        l  = l * c + p;  a = a * c + p * kv;  m = m'
    when pos completes its block ((pos + 1) % ratio == 0):  pooled[token] = a / l

The accumulator of a block starts empty at the block's first position (``pos % ratio == 0``):
the stored state is *not read* there, so a request needs no reset between blocks, and a prefix hit
(always at a block boundary, a multiple of ``ratio``) restarts from nothing. Every element sees the
same operations in the same order however the tokens are split into steps, so chunked prefill,
decode and a hit restart give bit-identical entries within one backend. Against a batch softmax
over the block's rows (the reference model) the pooled rows differ by rounding only (about 1e-7
relative in fp32).

:func:`hca_state_update` (Triton) and :func:`hca_state_update_ref` (torch) share the contract.
The Triton kernel runs one program per (sequence, block segment of its chunk, width tile): block
segments are independent because each starts empty except the chunk's first, which continues the
stored state.
"""

from __future__ import annotations

import torch

from atom.kv_group import HCA_STATE_ROWS  # running max, running sum of exp, running weighted sum

from ._common import (HAS_TRITON, Redirect, check_index, check_positive, check_range, check_rows,
                      check_same_device, launch_tiles, masked_redirect, put_redirected, require_triton, triton, tl)
from .step_memo import memoized
from .swa_write import check_ragged

__all__ = ["hca_state_update", "hca_state_update_ref", "HCA_STATE_ROWS", "empty_hca_state"]



def empty_hca_state(acc: torch.Tensor) -> None:
    """Set every slot of ``acc`` to the empty accumulator (max -inf, sums 0)."""
    acc[:, 0].fill_(float("-inf"))
    acc[:, 1:].zero_()


# ----------------------------------------------------------------------------------------------
# checks
# ----------------------------------------------------------------------------------------------

def _check(kv, score, ape, acc, state_slot, cu_seqlens, pos_start, pooled) -> int:
    check_rows("kv", kv, dtype=torch.float32)
    width = kv.shape[1]
    check_rows("score", score, dtype=torch.float32, width=width)
    check_rows("pooled", pooled, dtype=torch.float32, width=width)
    if score.shape[0] != kv.shape[0] or pooled.shape[0] != kv.shape[0]:
        raise ValueError(f"kv, score and pooled must have one row per token: {kv.shape[0]}, "
                         f"{score.shape[0]}, {pooled.shape[0]}")
    check_rows("ape", ape, dtype=torch.float32, width=width)
    check_positive("ape.shape[0] (the compress ratio)", ape.shape[0])
    check_rows("acc", acc, ndim=3, dtype=torch.float32, width=width)
    if acc.shape[1] != HCA_STATE_ROWS:
        raise ValueError(f"acc must be [num_slots, {HCA_STATE_ROWS}, width] (max, sum, weighted sum), "
                         f"got {tuple(acc.shape)}")
    check_same_device(kv=kv, score=score, ape=ape, acc=acc, state_slot=state_slot, cu_seqlens=cu_seqlens,
                      pos_start=pos_start, pooled=pooled)
    max_len = check_ragged(kv.shape[0], cu_seqlens, pos_start, 2**31 - 1)
    check_index("state_slot", state_slot, (cu_seqlens.shape[0] - 1,))
    check_range("state_slot", state_slot, -1, acc.shape[0], "a slot of acc, or -1 = skip")
    return max_len


# ----------------------------------------------------------------------------------------------
# torch reference
# ----------------------------------------------------------------------------------------------

def _segments(cu_seqlens, pos_start, state_slot, ratio, max_len):
    """Block segments of every sequence's chunk on a static ``[num_seqs * nb]`` grid (``nb`` = the most
    blocks a chunk of ``max_len`` tokens touches): (seq, block, first pos, end pos, token of pos 0 of the
    sequence's chunk, is the sequence's last segment, live). Nothing is read back to the host."""
    lens = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
    p0 = pos_start.long()
    nb = (max_len + ratio - 2) // ratio + 1
    first_b, last_b = p0 // ratio, (p0 + lens - 1).clamp(min=0) // ratio
    count = torch.where((lens > 0) & (state_slot >= 0), last_b - first_b + 1, 0)
    seq = torch.arange(lens.numel(), device=lens.device).repeat_interleave(nb)  # a constant repeat: no sync
    k = torch.arange(nb, device=lens.device).repeat(lens.numel())
    block = first_b[seq] + k
    lo = torch.maximum(p0[seq], block * ratio)
    hi = torch.minimum(p0[seq] + lens[seq], (block + 1) * ratio)
    live = k < count[seq]
    return seq, block, lo, hi, cu_seqlens[:-1].long()[seq] - p0[seq], live & (k == count[seq] - 1), live


def hca_state_update_ref(kv: torch.Tensor, score: torch.Tensor, ape: torch.Tensor, acc: torch.Tensor,
                         state_slot: torch.Tensor, cu_seqlens: torch.Tensor, pos_start: torch.Tensor,
                         pooled: torch.Tensor, max_len: int | None = None) -> None:
    """Torch reference of :func:`hca_state_update` (same contract): all block segments of the batch
    advance together, one position of their segment at a time, so each element sees the sequential
    order. Shapes depend only on the batch's shape and ``max_len``: nothing is read back."""
    bound = _check(kv, score, ape, acc, state_slot, cu_seqlens, pos_start, pooled)
    max_len = bound if max_len is None else max_len
    ratio = ape.shape[0]
    if max_len == 0 or state_slot.shape[0] == 0:
        return
    slot, fresh, offsets, final = _plan(cu_seqlens, pos_start, state_slot, ratio, max_len, kv.shape[0])
    start = acc[slot]
    m = torch.where(fresh, float("-inf"), start[:, 0])
    l = torch.where(fresh, 0.0, start[:, 1])
    a = torch.where(fresh, 0.0, start[:, 2])
    for t, ape_row, upd, finished in offsets:
        s = score[t] + ape[ape_row]
        m_new = torch.maximum(m, s)
        c = torch.exp(m - m_new)
        p = torch.exp(s - m_new)
        l = torch.where(upd, l * c + p, l)
        a = torch.where(upd, a * c + p * kv[t], a)
        m = torch.where(upd, m_new, m)
        put_redirected(((pooled, a / l),), finished)
    put_redirected(((acc, torch.stack((m, l, a), dim=1)),), final)


@memoized
def _plan(cu_seqlens: torch.Tensor, pos_start: torch.Tensor, state_slot: torch.Tensor, ratio: int, max_len: int,
          num_tokens: int) -> tuple[torch.Tensor, torch.Tensor, list[tuple], Redirect]:
    """The index arithmetic of :func:`hca_state_update_ref`, once per step (:mod:`.step_memo`): each segment's
    state slot and whether it starts empty, per offset into the segments (token, ape row, ``[S, 1]`` update
    mask, the redirect of the pooled rows it finishes), and the redirect of the state write-back."""
    seq, block, lo, hi, tok_base, is_last, live = _segments(cu_seqlens, pos_start, state_slot, ratio, max_len)
    slot = state_slot.long()[seq].clamp(min=0)
    offsets = []
    for off in range(min(ratio, max_len)):
        pos = lo + off
        on = live & (pos < hi)
        t = (tok_base + pos).clamp(0, num_tokens - 1)
        offsets.append((t, pos % ratio, on[:, None], masked_redirect((t,), on & (pos % ratio == ratio - 1))))
    return slot, (lo % ratio == 0)[:, None], offsets, masked_redirect((slot,), is_last)


# ----------------------------------------------------------------------------------------------
# Triton
# ----------------------------------------------------------------------------------------------

if HAS_TRITON:

    @triton.jit
    def _hca_kernel(kv_ptr, score_ptr, ape_ptr, acc_ptr, slot_ptr, cu_ptr, pstart_ptr, out_ptr, width,
                    kv_stride, score_stride, ape_stride, acc_s0, acc_s1, out_stride, ratio,
                    BLOCK_W: tl.constexpr):
        s = tl.program_id(0)
        k = tl.program_id(1)
        w = tl.program_id(2) * BLOCK_W + tl.arange(0, BLOCK_W)
        wm = w < width
        start = tl.load(cu_ptr + s)
        n = tl.load(cu_ptr + s + 1) - start
        p0 = tl.load(pstart_ptr + s)
        slot = tl.load(slot_ptr + s).to(tl.int64)
        block = p0 // ratio + k
        lo = tl.maximum(p0, block * ratio)
        hi = tl.minimum(p0 + n, (block + 1) * ratio)
        if (slot >= 0) & (lo < hi):
            acc_row = acc_ptr + slot * acc_s0 + w
            cont = wm & (lo % ratio != 0)  # a block's first position starts empty: nothing is read
            m = tl.load(acc_row, mask=cont, other=float("-inf"))
            l = tl.load(acc_row + acc_s1, mask=cont, other=0.0)
            a = tl.load(acc_row + 2 * acc_s1, mask=cont, other=0.0)
            for pos in range(lo, hi):
                t = (start + pos - p0).to(tl.int64)
                sc = tl.load(score_ptr + t * score_stride + w, mask=wm, other=0.0) + \
                    tl.load(ape_ptr + (pos % ratio).to(tl.int64) * ape_stride + w, mask=wm, other=0.0)
                x = tl.load(kv_ptr + t * kv_stride + w, mask=wm, other=0.0)
                m_new = tl.maximum(m, sc)
                c = tl.exp(m - m_new)
                p = tl.exp(sc - m_new)
                l = l * c + p
                a = a * c + p * x
                m = m_new
                if (pos + 1) % ratio == 0:
                    tl.store(out_ptr + t * out_stride + w, a / l, mask=wm)
            if hi == p0 + n:  # the sequence's last segment leaves its state for the next step
                tl.store(acc_row, m, mask=wm)
                tl.store(acc_row + acc_s1, l, mask=wm)
                tl.store(acc_row + 2 * acc_s1, a, mask=wm)


def hca_state_update(kv: torch.Tensor, score: torch.Tensor, ape: torch.Tensor, acc: torch.Tensor,
                     state_slot: torch.Tensor, cu_seqlens: torch.Tensor, pos_start: torch.Tensor,
                     pooled: torch.Tensor, max_len: int | None = None) -> None:
    """Advance each sequence's HCA accumulator over its chunk; write the pooled row of every block
    the chunk completes.

    Args:
        kv, score: fp32 ``[num_tokens, width]`` pre-pool projections of the chunk's tokens.
        ape: fp32 ``[ratio, width]`` positional bias, added as ``ape[pos % ratio]`` (zeros when
            ``score`` already includes it).
        acc: fp32 ``[num_slots, 3, width]`` accumulators (max, sum, weighted sum; inner dim
            contiguous, other strides arbitrary); read only where a chunk starts mid-block.
        state_slot: int32 ``[num_seqs]`` accumulator slot per sequence, -1 = skip the sequence.
        cu_seqlens: int32 ``[num_seqs + 1]`` token offsets; pos_start: int32 ``[num_seqs]``.
        pooled: fp32 ``[num_tokens, width]`` output: row ``t`` is written exactly when token ``t``
            completes its block (``(pos + 1) % ratio == 0``); other rows are left untouched.
        max_len: the longest chunk, when the caller knows it (the step's metadata); None = derive it
            (a device read under value checks, else the token count).
    """
    bound = _check(kv, score, ape, acc, state_slot, cu_seqlens, pos_start, pooled)
    max_len = bound if max_len is None else max_len
    require_triton("hca_state_update")
    ratio = ape.shape[0]
    if max_len == 0:
        return
    _, bw = launch_tiles(kv.device, kv.shape[1])
    grid = (state_slot.shape[0], triton.cdiv(max_len, ratio) + 1, triton.cdiv(kv.shape[1], bw))
    _hca_kernel[grid](kv, score, ape, acc, state_slot, cu_seqlens, pos_start, pooled, kv.shape[1],
                      kv.stride(0), score.stride(0), ape.stride(0), acc.stride(0), acc.stride(1),
                      pooled.stride(0), ratio, BLOCK_W=bw)
