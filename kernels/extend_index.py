"""Window index of a prefill chunk split between the SWA rows and the step's own K rows.

Kept apart from ``paged_index`` because it serves one extra use: attention *before* the chunk's K
rows are in the SWA pages (window-only prefill writes them after attention, so a chunk longer than
the window never has its early rows paged). For query token ``t`` of sequence ``s`` at position
``pos`` the window positions ``q = max(0, pos-W+1) .. pos`` (oldest first, slot ``w``) split into:

* ``q <  pos_start[s]`` (before the chunk): ``swa_idx[t, w]`` = the physical SWA row, as in
  :func:`atom.kernels.paged_index.build_window_index`; ``extend_idx[t, w] = -1``;
* ``q >= pos_start[s]`` (inside the chunk): ``extend_idx[t, w] = cu_seqlens[s] + q - pos_start[s]``,
  a row of the step's K tensor; ``swa_idx[t, w] = -1``.

Slots past the window length and padding tokens are -1 in both. :func:`sparse_attention` takes the
pair as its window source plus its ``extend_rows`` / ``extend_idx`` source.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ._common import (HAS_TRITON, check_index, check_range, next_pow2, require_triton, triton, tl,
                      value_checks_enabled)
from .paged_index import _check_window, _token_tile

__all__ = ["SplitWindowIndex", "build_split_window_index", "build_split_window_index_ref"]


class SplitWindowIndex(NamedTuple):
    """Both halves of a prefill window (int32 ``[T, W]``, -1 = not in this source)."""

    swa_idx: torch.Tensor  # rows of the SWA view (positions before the chunk)
    extend_idx: torch.Tensor  # rows of the step's K tensor (positions inside the chunk)


def _check(swa_table, seq_idx, positions, cu_seqlens, pos_start, window, block_size, row_stride) -> None:
    _check_window(swa_table, seq_idx, positions, window, block_size, row_stride)
    check_index("cu_seqlens", cu_seqlens, (swa_table.shape[0] + 1,))
    check_index("pos_start", pos_start, (swa_table.shape[0],))
    check_range("pos_start", pos_start, 0, 2**31 - 1, "absolute position of each chunk's first token")
    if not value_checks_enabled():
        return
    live = (seq_idx >= 0) & (positions >= 0)
    s = seq_idx[live].long()
    local = positions[live].long() - pos_start[s].long()
    check_range("positions - pos_start[seq]", local, 0, 2**31 - 1, "queries lie inside their chunk")
    check_range("cu_seqlens[seq] + (positions - pos_start[seq])", cu_seqlens[s].long() + local, 0,
                int(cu_seqlens[-1]), "a row of the step's K tensor")


def build_split_window_index_ref(swa_table: torch.Tensor, seq_idx: torch.Tensor, positions: torch.Tensor,
                                 cu_seqlens: torch.Tensor, pos_start: torch.Tensor, *, window: int, block_size: int,
                                 row_stride: int) -> SplitWindowIndex:
    """Torch reference of :func:`build_split_window_index` (same contract)."""
    _check(swa_table, seq_idx, positions, cu_seqlens, pos_start, window, block_size, row_stride)
    live = (seq_idx >= 0) & (positions >= 0)
    s = seq_idx.long().clamp(min=0)[:, None]
    pos = positions.long()[:, None]
    n = torch.clamp(pos + 1, max=window)
    w = torch.arange(window, device=pos.device)[None, :]
    q = torch.where(live[:, None] & (w < n), pos - n + 1 + w, -1)
    start = pos_start.long()[s]
    inside = (q >= start) & (q >= 0)
    before = (q < start) & (q >= 0)
    qs = torch.where(before, q, 0)
    page = swa_table[s, qs // block_size].long()
    swa = torch.where(before & (page >= 0), page * row_stride + qs % block_size, -1)
    ext = torch.where(inside, cu_seqlens.long()[s] + q - start, -1)
    return SplitWindowIndex(swa.to(torch.int32), ext.to(torch.int32))


if HAS_TRITON:

    @triton.jit
    def _split_window_kernel(swa_out, ext_out, table_ptr, seq_ptr, pos_ptr, cu_ptr, pstart_ptr, num_tokens,
                             table_stride, window, block_size, row_stride, BLOCK_T: tl.constexpr,
                             BLOCK_K: tl.constexpr):
        t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
        tok = t < num_tokens
        seq = tl.load(seq_ptr + t, mask=tok, other=-1)
        pos = tl.load(pos_ptr + t, mask=tok, other=-1)
        live = (seq >= 0) & (pos >= 0)
        start = tl.load(pstart_ptr + seq, mask=live, other=0)
        row0 = tl.load(cu_ptr + seq, mask=live, other=0)
        n = tl.minimum(pos + 1, window)
        for w0 in range(0, window, BLOCK_K):
            w = w0 + tl.arange(0, BLOCK_K)
            q = pos[:, None] - n[:, None] + 1 + w[None, :]
            ok = live[:, None] & (w[None, :] < n[:, None])
            inside = ok & (q >= start[:, None])
            before = ok & (q < start[:, None])
            page = tl.load(table_ptr + seq[:, None].to(tl.int64) * table_stride + q // block_size, mask=before,
                           other=-1)
            swa = tl.where(page >= 0, page * row_stride + q % block_size, -1)
            ext = tl.where(inside, row0[:, None] + q - start[:, None], -1)
            off = t[:, None].to(tl.int64) * window + w[None, :]
            m = tok[:, None] & (w[None, :] < window)
            tl.store(swa_out + off, swa, mask=m)
            tl.store(ext_out + off, ext, mask=m)


def build_split_window_index(swa_table: torch.Tensor, seq_idx: torch.Tensor, positions: torch.Tensor,
                             cu_seqlens: torch.Tensor, pos_start: torch.Tensor, *, window: int, block_size: int,
                             row_stride: int) -> SplitWindowIndex:
    """Split each query's window between SWA rows (before its chunk) and K-tensor rows (inside it).

    Args:
        swa_table: int32 ``[num_seqs, max_blocks]``; seq_idx, positions: int32 ``[T]`` (-1 = padding).
        cu_seqlens: int32 ``[num_seqs + 1]`` rows of the step's K tensor per sequence;
        pos_start: int32 ``[num_seqs]`` position of each chunk's first token (every query of a
            sequence lies in its chunk). window, block_size, row_stride: as in ``build_window_index``.
    """
    _check(swa_table, seq_idx, positions, cu_seqlens, pos_start, window, block_size, row_stride)
    require_triton("build_split_window_index")
    num_tokens = seq_idx.shape[0]
    swa = torch.empty(num_tokens, window, dtype=torch.int32, device=seq_idx.device)
    ext = torch.empty_like(swa)
    if num_tokens:
        bt = _token_tile(seq_idx.device)
        bk = min(next_pow2(window), 1024 if seq_idx.device.type == "cpu" else 128)
        _split_window_kernel[(triton.cdiv(num_tokens, bt),)](
            swa, ext, swa_table, seq_idx, positions, cu_seqlens, pos_start, num_tokens, swa_table.stride(0), window,
            block_size, row_stride, BLOCK_T=bt, BLOCK_K=bk)
    return SplitWindowIndex(swa, ext)
