"""Per-query physical row lists for sparse attention (prefill and decode alike).

A query token ``t`` (sequence ``seq_idx[t]``, position ``positions[t]``) attends two row sets, which
live in two different row views of the arena, so they are returned as two index tensors:

* ``window_idx [T, window]``: its SWA window, positions ``max(0, pos-W+1) .. pos`` oldest to newest,
  as physical SWA rows ``swa_table[s, p // block_size] * row_stride + p % block_size``; padded with
  -1 at the tail. A window position whose table entry is -1 is -1 (masked), never page 0.
* ``comp_idx [T, Kc]``: compressed rows, physical rows of the compressed view
  ``(page // pages_per_chunk) * chunk_rows + (page % pages_per_chunk) * epb + i % epb`` with
  ``page = comp_table[s, i // epb]``:

  - a CSA layer (``topk`` given): the given top-k logical entries ``topk[t, :]`` (-1 padding kept
    as -1), in order;
  - an HCA layer (``topk=None``): all completed entries ``i < (pos + 1) // ratio`` in order, -1
    padding to ``Kc``;
  - a dense layer has no compressed rows: it builds only the window index.

Tokens with ``seq_idx == -1`` or ``positions == -1`` (padding) get all -1 rows. The window index is
the same for every layer kind (:mod:`atom.kv_group` says which kind a compress ratio is).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ._common import (HAS_TRITON, check_comp_geometry, check_index, check_positive, check_range,
                      check_same_device, check_swa_geometry, compressed_row, next_pow2, require_triton, triton, tl,
                      value_checks_enabled)
from .tiles import tiles_for

__all__ = ["build_window_index", "build_window_index_ref", "build_comp_index", "build_comp_index_ref"]


class CompGeometry(NamedTuple):
    """How a compressed group addresses its rows (see module docstring)."""

    ratio: int
    entries_per_block: int
    pages_per_chunk: int
    chunk_rows: int


# ----------------------------------------------------------------------------------------------
# checks
# ----------------------------------------------------------------------------------------------

def _check_tokens(table, seq_idx, positions, name) -> None:
    check_index(name, table, (None, None))
    check_index("seq_idx", seq_idx, (None,))
    check_index("positions", positions, seq_idx.shape)
    check_same_device(**{name: table, "seq_idx": seq_idx, "positions": positions})
    check_range("seq_idx", seq_idx, -1, table.shape[0], f"a row of {name}, or -1 = padding")
    check_range("positions", positions, -1, 2**31 - 1, "absolute positions, or -1 = padding")


def _check_window(swa_table, seq_idx, positions, window, block_size, row_stride) -> None:
    check_swa_geometry(block_size, row_stride)
    check_positive("window", window)
    _check_tokens(swa_table, seq_idx, positions, "swa_table")
    check_range("swa_table", swa_table, -1, 2**31 // row_stride, "pages whose rows fit in int32")
    check_range("positions", positions, -1, swa_table.shape[1] * block_size, "covered by swa_table")


def _visible(seq_idx, positions, ratio) -> torch.Tensor:
    """Completed entries each token may see: (pos + 1) // ratio, 0 for padding tokens."""
    live = (seq_idx >= 0) & (positions >= 0)
    return torch.where(live, (positions.long() + 1) // ratio, 0)


def _check_comp(comp_table, seq_idx, positions, topk, width, geo: CompGeometry) -> None:
    check_positive("ratio", geo.ratio)
    check_comp_geometry(geo.entries_per_block, geo.pages_per_chunk, geo.chunk_rows)
    _check_tokens(comp_table, seq_idx, positions, "comp_table")
    check_range("comp_table", comp_table, -1, (2**31 - geo.chunk_rows) // geo.chunk_rows * geo.pages_per_chunk,
                "pages whose rows fit in int32")
    if topk is not None:
        check_index("topk", topk, (seq_idx.shape[0], None))
        check_same_device(topk=topk, comp_table=comp_table)
    if not value_checks_enabled():
        return  # the value checks below compute tensors first (visible entries): device work skipped with them
    vis = _visible(seq_idx, positions, geo.ratio)
    cover = comp_table.shape[1] * geo.entries_per_block
    check_range("completed entries (pos + 1) // ratio", vis, 0, cover + 1, f"comp_table covers {cover} entries")
    if topk is None:
        check_range(f"completed entries (pos + 1) // ratio (width {width})", vis, 0, width + 1,
                    "raise the hca index width")
        return
    check_range("topk", topk, -1, cover, "logical entry indices, or -1 = padding")
    live = ((seq_idx >= 0) & (positions >= 0))[:, None]
    if bool(((topk.long() >= vis[:, None]) & (topk >= 0) & live).any()):
        raise ValueError("topk holds an entry a query cannot see yet (entry i needs i < (pos + 1) // ratio)")


# ----------------------------------------------------------------------------------------------
# torch references
# ----------------------------------------------------------------------------------------------

def build_window_index_ref(swa_table: torch.Tensor, seq_idx: torch.Tensor, positions: torch.Tensor, *,
                           window: int, block_size: int, row_stride: int) -> torch.Tensor:
    """Torch reference of :func:`build_window_index` (same contract)."""
    _check_window(swa_table, seq_idx, positions, window, block_size, row_stride)
    live = (seq_idx >= 0) & (positions >= 0)
    pos = positions.long()[:, None]
    n = torch.clamp(pos + 1, max=window)
    w = torch.arange(window, device=pos.device)[None, :]
    p = pos - n + 1 + w
    ok = live[:, None] & (w < n)
    p = torch.where(ok, p, 0)
    page = swa_table[seq_idx.long().clamp(min=0)[:, None], p // block_size].long()
    ok = ok & (page >= 0)
    return torch.where(ok, page * row_stride + p % block_size, -1).to(torch.int32)


def build_comp_index_ref(comp_table: torch.Tensor, seq_idx: torch.Tensor, positions: torch.Tensor,
                         topk: torch.Tensor | None, *, width: int, ratio: int, entries_per_block: int,
                         pages_per_chunk: int, chunk_rows: int) -> torch.Tensor:
    """Torch reference of :func:`build_comp_index` (same contract)."""
    geo = CompGeometry(ratio, entries_per_block, pages_per_chunk, chunk_rows)
    _check_comp(comp_table, seq_idx, positions, topk, width, geo)
    if topk is None:
        w = torch.arange(width, device=seq_idx.device)[None, :]
        ent = w.expand(seq_idx.shape[0], width)
        ok = w < _visible(seq_idx, positions, ratio)[:, None]
    else:
        ent = topk.long()
        ok = (ent >= 0) & ((seq_idx >= 0) & (positions >= 0))[:, None]
    ent = torch.where(ok, ent, 0)
    page = comp_table[seq_idx.long().clamp(min=0)[:, None], ent // entries_per_block]
    ok = ok & (page >= 0)
    row = compressed_row(page, ent % entries_per_block, entries_per_block, pages_per_chunk, chunk_rows)
    return torch.where(ok, row, -1).to(torch.int32)


# ----------------------------------------------------------------------------------------------
# Triton
# ----------------------------------------------------------------------------------------------

if HAS_TRITON:

    @triton.jit
    def _window_kernel(out_ptr, table_ptr, seq_ptr, pos_ptr, num_tokens, table_stride, window, block_size,
                       row_stride, BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr):
        t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
        tok = t < num_tokens
        seq = tl.load(seq_ptr + t, mask=tok, other=-1)
        pos = tl.load(pos_ptr + t, mask=tok, other=-1)
        live = (seq >= 0) & (pos >= 0)
        n = tl.minimum(pos + 1, window)
        for w0 in range(0, window, BLOCK_K):
            w = w0 + tl.arange(0, BLOCK_K)
            p = pos[:, None] - n[:, None] + 1 + w[None, :]
            ok = live[:, None] & (w[None, :] < n[:, None])
            page = tl.load(table_ptr + seq[:, None].to(tl.int64) * table_stride + p // block_size,
                           mask=ok, other=-1)
            row = tl.where(page >= 0, page * row_stride + p % block_size, -1)
            tl.store(out_ptr + t[:, None].to(tl.int64) * window + w[None, :], row,
                     mask=tok[:, None] & (w[None, :] < window))

    @triton.jit
    def _comp_kernel(out_ptr, table_ptr, seq_ptr, pos_ptr, topk_ptr, num_tokens, width, table_stride, topk_stride,
                     ratio, epb, pages_per_chunk, chunk_rows, ALL_COMPLETED: tl.constexpr,
                     BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr):
        t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
        tok = t < num_tokens
        seq = tl.load(seq_ptr + t, mask=tok, other=-1)
        pos = tl.load(pos_ptr + t, mask=tok, other=-1)
        live = (seq >= 0) & (pos >= 0)
        w = tl.program_id(1) * BLOCK_K + tl.arange(0, BLOCK_K)
        inside = tok[:, None] & (w[None, :] < width)
        if ALL_COMPLETED:
            ent = w[None, :] + 0 * t[:, None]
            ok = live[:, None] & (ent < ((pos + 1) // ratio)[:, None])
        else:
            ent = tl.load(topk_ptr + t[:, None].to(tl.int64) * topk_stride + w[None, :], mask=inside, other=-1)
            ok = live[:, None] & (ent >= 0)
        page = tl.load(table_ptr + seq[:, None].to(tl.int64) * table_stride + ent // epb, mask=ok & inside,
                       other=-1)
        row = (page // pages_per_chunk) * chunk_rows + (page % pages_per_chunk) * epb + ent % epb
        row = tl.where(page >= 0, row, -1)
        tl.store(out_ptr + t[:, None].to(tl.int64) * width + w[None, :], row, mask=inside)


def _tiles(device: torch.device, width: int) -> tuple[int, int]:
    """(tokens per program, index tile) from :mod:`atom.kernels.tiles`."""
    t = tiles_for(device)
    return t.index_tokens, min(next_pow2(width), t.index_width)


def build_window_index(swa_table: torch.Tensor, seq_idx: torch.Tensor, positions: torch.Tensor, *, window: int,
                       block_size: int, row_stride: int) -> torch.Tensor:
    """int32 ``[T, window]`` physical SWA rows of each token's window, oldest first, -1 padded.

    Args:
        swa_table: int32 ``[num_seqs, max_blocks]`` physical SWA pages, -1 = none.
        seq_idx, positions: int32 ``[T]`` per query token; -1 = padding token.
        window: the sliding window W (the query's own row included).
        block_size, row_stride: as in :func:`atom.kernels.swa_write.swa_write`.
    """
    _check_window(swa_table, seq_idx, positions, window, block_size, row_stride)
    require_triton("build_window_index")
    num_tokens = seq_idx.shape[0]
    out = torch.empty(num_tokens, window, dtype=torch.int32, device=seq_idx.device)
    if num_tokens == 0:
        return out
    bt, bk = _tiles(seq_idx.device, window)
    _window_kernel[(triton.cdiv(num_tokens, bt),)](out, swa_table, seq_idx, positions, num_tokens,
                                                   swa_table.stride(0), window, block_size, row_stride,
                                                   BLOCK_T=bt, BLOCK_K=bk)
    return out


def build_comp_index(comp_table: torch.Tensor, seq_idx: torch.Tensor, positions: torch.Tensor,
                     topk: torch.Tensor | None, *, width: int, ratio: int, entries_per_block: int,
                     pages_per_chunk: int, chunk_rows: int) -> torch.Tensor:
    """int32 ``[T, width]`` physical compressed rows each token attends, -1 padded.

    With ``topk`` (int32 ``[T, K]`` logical entries, -1 padding; CSA) the output is ``[T, K]`` and
    ``width`` must equal K. With ``topk=None`` (HCA) it lists every completed entry
    ``i < (pos + 1) // ratio``; ``width`` must cover the longest such list.
    """
    if topk is not None and (not isinstance(topk, torch.Tensor) or topk.dim() != 2 or topk.shape[1] != width):
        raise ValueError(f"topk must be [T, width={width}], got {getattr(topk, 'shape', topk)}")
    _check_comp(comp_table, seq_idx, positions, topk, width,
                CompGeometry(ratio, entries_per_block, pages_per_chunk, chunk_rows))
    require_triton("build_comp_index")
    num_tokens = seq_idx.shape[0]
    out = torch.empty(num_tokens, width, dtype=torch.int32, device=seq_idx.device)
    if num_tokens == 0 or width == 0:
        return out
    bt, bk = _tiles(seq_idx.device, width)
    grid = (triton.cdiv(num_tokens, bt), triton.cdiv(width, bk))
    _comp_kernel[grid](out, comp_table, seq_idx, positions, seq_idx if topk is None else topk, num_tokens, width,
                       comp_table.stride(0), 0 if topk is None else topk.stride(0), ratio, entries_per_block,
                       pages_per_chunk, chunk_rows, ALL_COMPLETED=topk is None, BLOCK_T=bt, BLOCK_K=bk)
    return out
