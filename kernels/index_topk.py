"""The indexer's top-k select: each query's picks from its candidate scores, ascending and -1 padded.

Contract (``index_topk`` and ``index_topk_ref`` share it; the rule of ``Indexer.select_scores``)::

    index_topk(scores [T, N] fp32, visible [T] int, topk) -> int32 [T, topk]

Row ``t`` picks the ``k = min(topk, N)`` largest scores among its entries ``n < visible[t]`` (ties to the lower
entry; every visible entry when there are at most ``k``), lists the picked entries in ascending order and pads
with ``-1``. Scores compare as floats (``-0.0`` equals ``0.0``).

Torch reference: ``torch.topk`` gives the k-th largest visible score; the entries above it, then the lowest of
those equal to it, are picked, and a binary search of the running pick count places them (the same ops for any
number of queries, nothing read back).

Triton: one program per query, one launch, the scores read a few times and never sorted. Each score becomes an
order-preserving 32-bit key; a radix select finds the k-th largest key one byte at a time (four passes, each a
256-bin histogram of the keys that match the bytes found so far), which also gives how many tied entries are
still needed; a last pass picks the entries above the threshold and the first needed ones equal to it and
writes them at their running count (a prefix sum), then ``-1`` past the picks.
"""

from __future__ import annotations

import torch

from ._common import HAS_TRITON, check_same_device, next_pow2, require_triton, triton, tl

__all__ = ["index_topk", "index_topk_ref", "topk_picks"]

#: scores each program reads per step of its passes
BLOCK = 1024


def _check(scores: torch.Tensor, visible: torch.Tensor, topk: int) -> None:
    if scores.dim() != 2 or scores.dtype != torch.float32:
        raise ValueError(f"index_topk: scores must be fp32 [T, N], got {scores.dtype} {tuple(scores.shape)}")
    if visible.shape != (scores.shape[0],) or visible.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"index_topk: visible must be int32/int64 [T={scores.shape[0]}], got {visible.dtype} "
                         f"{tuple(visible.shape)}")
    if topk < 1:
        raise ValueError(f"index_topk: topk must be >= 1, got {topk}")
    check_same_device(scores=scores, visible=visible)


def index_topk_ref(scores: torch.Tensor, visible: torch.Tensor, topk: int) -> torch.Tensor:
    """Torch reference of :func:`index_topk` (module docstring)."""
    _check(scores, visible, topk)
    return topk_picks(scores, visible, topk)


def topk_picks(scores: torch.Tensor, visible: torch.Tensor, topk: int) -> torch.Tensor:
    """The select rule itself, unchecked (the reference model's ``Indexer.select_scores`` is this): ``torch.topk``
    gives each row's k-th largest visible score; every entry above it is picked, and of the entries equal to it
    the lowest fill the remaining places; output place ``j`` holds the entry at which the running count of picks
    reaches ``j + 1`` (a binary search), so rows come out ascending and -1 padded, with the same ops whatever
    the number of queries."""
    t, n = scores.shape
    k = min(topk, n)
    if k == 0:
        return torch.full((t, topk), -1, dtype=torch.int32, device=scores.device)
    seen = torch.arange(n, device=scores.device)[None, :] < visible[:, None]
    masked = torch.where(seen, scores, float("-inf"))
    kth = torch.topk(masked, k, dim=1).values[:, -1:]
    above = seen & (masked > kth)
    tied = seen & (masked == kth)
    room = k - above.sum(dim=1, keepdim=True)
    running = (above | (tied & (tied.cumsum(dim=1) <= room))).cumsum(dim=1)  # picks up to each entry
    place = torch.searchsorted(running, torch.arange(1, topk + 1, device=scores.device).repeat(t, 1))
    return torch.where(place < n, place, -1).to(torch.int32)


if HAS_TRITON:

    @triton.jit
    def _keys(s_ptr, n0, N, vis, BLOCK: tl.constexpr):
        """``(entries, order-preserving uint32 keys, visible)`` of entries ``n0 .. n0 + BLOCK`` of a row."""
        n = n0 + tl.arange(0, BLOCK)
        ok = n < vis
        s = tl.load(s_ptr + n, mask=n < N, other=0.0)
        s = tl.where(s == 0.0, 0.0, s)  # -0.0 ties with 0.0, as float comparison has it
        bits = s.to(tl.uint32, bitcast=True)
        flip = tl.where((bits >> 31) == 1, 0xFFFFFFFF, 0x80000000).to(tl.uint32)
        return n, bits ^ flip, ok

    @triton.jit
    def _index_topk_kernel(s_ptr, vis_ptr, out_ptr, N, stride_s, stride_o, K, TOPK,
                           BLOCK: tl.constexpr, TOPK_BLOCK: tl.constexpr):
        t = tl.program_id(0)
        row = s_ptr + t.to(tl.int64) * stride_s
        vis = tl.minimum(tl.maximum(tl.load(vis_ptr + t).to(tl.int32), 0), N)
        take_all = vis <= K  # at most k visible entries: every one of them is picked
        prefix = tl.zeros((), dtype=tl.uint32)
        want = K  # picks still to find among the keys that match ``prefix`` on the bytes found so far
        bins = tl.arange(0, 256)
        for level in tl.static_range(4):
            shift = 24 - 8 * level
            hist = tl.zeros((256,), dtype=tl.int32)
            for n0 in range(0, N, BLOCK):
                _, key, ok = _keys(row, n0, N, vis, BLOCK)
                if level > 0:
                    ok = ok & ((key >> (shift + 8)) == (prefix >> (shift + 8)))
                hist += tl.histogram(((key >> shift) & 255).to(tl.int32), 256, mask=ok)
            at_least = tl.sum(hist, 0) - tl.cumsum(hist, 0) + hist  # keys whose byte is >= each bin
            digit = tl.maximum(tl.sum((at_least >= want).to(tl.int32), 0) - 1, 0)
            above = tl.sum(tl.where(bins > digit, hist, 0), 0)
            want = want - above
            prefix = prefix | (digit.to(tl.uint32) << shift)
        count = 0
        tied_before = 0
        for n0 in range(0, N, BLOCK):
            n, key, ok = _keys(row, n0, N, vis, BLOCK)
            tied = ok & (key == prefix)
            tie_rank = tied_before + tl.cumsum(tied.to(tl.int32), 0) - tied.to(tl.int32)
            pick = ok & (take_all | (key > prefix) | (tied & (tie_rank < want)))
            place = count + tl.cumsum(pick.to(tl.int32), 0) - 1
            tl.store(out_ptr + t.to(tl.int64) * stride_o + place, n, mask=pick)
            count += tl.sum(pick.to(tl.int32), 0)
            tied_before += tl.sum(tied.to(tl.int32), 0)
        for j0 in range(0, TOPK, TOPK_BLOCK):
            j = j0 + tl.arange(0, TOPK_BLOCK)
            tl.store(out_ptr + t.to(tl.int64) * stride_o + j, tl.full((TOPK_BLOCK,), -1, tl.int32),
                     mask=(j >= count) & (j < TOPK))


def index_topk(scores: torch.Tensor, visible: torch.Tensor, topk: int) -> torch.Tensor:
    """Triton top-k select (same contract as :func:`index_topk_ref`): one launch, one program per query."""
    require_triton("index_topk")
    _check(scores, visible, topk)
    t, n = scores.shape
    out = torch.empty(t, topk, dtype=torch.int32, device=scores.device)
    if t == 0:
        return out
    if n == 0:
        return out.fill_(-1)
    if scores.stride(1) != 1:
        scores = scores.contiguous()
    _index_topk_kernel[(t,)](scores, visible, out, n, scores.stride(0), out.stride(0), min(topk, n), topk,
                             BLOCK=max(16, min(BLOCK, next_pow2(n))), TOPK_BLOCK=max(16, min(BLOCK, next_pow2(topk))))
    return out
