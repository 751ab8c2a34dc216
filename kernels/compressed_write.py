"""Scatter finished compressed entries into the compress-owned pages of one layer.

Addressing (fixed by the arena): with compress ratio ``r`` a logical block of ``block_size`` tokens
holds ``epb = block_size // r`` entries. Entry ``i`` of sequence ``s`` lives in logical block
``i // epb``, slot ``i % epb``; its page is ``page = comp_table[s, i // epb]`` and its physical row in
the layer's row view is::

    row = (page // pages_per_chunk) * chunk_rows + (page % pages_per_chunk) * epb + slot

(compressed pages are packed ``pages_per_chunk`` to a chunk, chunks are ``chunk_rows`` rows apart).
The same formula, applied to the indexer-key row view, places the CSA indexer keys: call the
function once for the main rows and once for the indexer keys, with the same table and indices.

Row formats: plain fp32/bf16 rows (``codec=None``, copied) or uint8 byte rows of ``fp8_ds_mla`` (main
rows) or FP8 indexer keys, named by ``codec``; fp32/bf16 ``entries`` are then encoded in registers on
the way in (see :mod:`atom.kernels.kv_rows`).

Sentinels: ``comp_table`` -1 = no page (entry skipped, never a page-0 fallback); ``seq_idx`` or
``entry_idx`` -1 = padding (skipped). Each destination row is written at most once per call.
"""

from __future__ import annotations

import torch

from ._common import (HAS_TRITON, Redirect, check_comp_geometry, check_index, check_range, check_same_device,
                      compressed_row, launch_tiles, masked_redirect, max_comp_page, put_redirected, require_triton,
                      triton, tl)
from .kv_rows import RowCodec, check_value_rows, codec_constexprs, encode_rows_ref
from .step_memo import memoized

__all__ = ["compressed_write", "compressed_write_ref"]


def _check(entries, rows, comp_table, seq_idx, entry_idx, epb, k, chunk_rows, codec) -> None:
    check_comp_geometry(epb, k, chunk_rows)
    check_value_rows("rows", rows, "entries", entries, codec)
    check_index("comp_table", comp_table, (None, None))
    check_index("seq_idx", seq_idx, (entries.shape[0],))
    check_index("entry_idx", entry_idx, (entries.shape[0],))
    check_same_device(entries=entries, rows=rows, comp_table=comp_table, seq_idx=seq_idx, entry_idx=entry_idx)
    n_pages = max_comp_page(rows.shape[0], epb, k, chunk_rows)
    check_range("comp_table", comp_table, -1, n_pages,
                f"rows has {rows.shape[0]} rows = {n_pages} compressed pages; -1 = no page")
    check_range("seq_idx", seq_idx, -1, comp_table.shape[0], "a row of comp_table, or -1 = padding")
    check_range("entry_idx", entry_idx, -1, comp_table.shape[1] * epb,
                "entries covered by comp_table's logical blocks, or -1 = padding")


def compressed_write_ref(entries: torch.Tensor, rows: torch.Tensor, comp_table: torch.Tensor,
                         seq_idx: torch.Tensor, entry_idx: torch.Tensor, *, entries_per_block: int,
                         pages_per_chunk: int, chunk_rows: int, codec: RowCodec = None) -> None:
    """Torch reference of :func:`compressed_write` (same contract)."""
    _check(entries, rows, comp_table, seq_idx, entry_idx, entries_per_block, pages_per_chunk, chunk_rows, codec)
    put_redirected(((rows, encode_rows_ref(entries, codec)),),
                   _entry_rows(comp_table, seq_idx, entry_idx, entries_per_block, pages_per_chunk, chunk_rows))


@memoized
def _entry_rows(comp_table: torch.Tensor, seq_idx: torch.Tensor, entry_idx: torch.Tensor, entries_per_block: int,
                pages_per_chunk: int, chunk_rows: int) -> Redirect:
    """Where each entry goes (a :func:`masked_redirect` of its physical row and whether it is written): index
    arithmetic only, the same for every layer of one ratio in a step (:mod:`.step_memo`)."""
    live = (seq_idx >= 0) & (entry_idx >= 0)
    ent = entry_idx.long().clamp(min=0)
    page = comp_table[seq_idx.long().clamp(min=0), ent // entries_per_block]
    keep = live & (page >= 0)
    dst = compressed_row(page.clamp(min=0), ent % entries_per_block, entries_per_block, pages_per_chunk,
                         chunk_rows)
    return masked_redirect((dst,), keep)


if HAS_TRITON:
    from .kv_rows import store_rows, token_page

    @triton.jit
    def _compressed_write_kernel(src_ptr, rows_ptr, table_ptr, seq_ptr, ent_ptr, n, width, src_stride,
                                 rows_stride, table_stride, epb, pages_per_chunk, chunk_rows,
                                 BLOCK_T: tl.constexpr, BLOCK_W: tl.constexpr, FMT: tl.constexpr, NOPE: tl.constexpr,
                                 ROPE: tl.constexpr, QBLOCK: tl.constexpr, PAD: tl.constexpr, PAD_P2: tl.constexpr,
                                 X_IS_BF16: tl.constexpr):
        t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
        ok, ent, page = token_page(seq_ptr, ent_ptr, table_ptr, t, n, table_stride, epb)
        row = (page // pages_per_chunk) * chunk_rows + (page % pages_per_chunk) * epb + ent % epb
        store_rows(src_ptr, t.to(tl.int64) * src_stride, rows_ptr, row * rows_stride, ok, width, BLOCK_W, FMT, NOPE,
                   ROPE, QBLOCK, PAD, PAD_P2, X_IS_BF16)


def compressed_write(entries: torch.Tensor, rows: torch.Tensor, comp_table: torch.Tensor, seq_idx: torch.Tensor,
                     entry_idx: torch.Tensor, *, entries_per_block: int, pages_per_chunk: int,
                     chunk_rows: int, codec: RowCodec = None) -> None:
    """Write ``entries[n]`` as entry ``entry_idx[n]`` of sequence ``seq_idx[n]``.

    Args:
        entries: ``[num_entries, width]`` finished compressed rows (main rows or indexer keys), same
            dtype as ``rows`` (fp32/bf16 values of ``codec``'s width for a byte view), inner dim contiguous.
        rows: ``[num_rows, width]`` the layer's compressed (or indexer-key) row view; uint8
            ``[num_rows, codec.row_bytes]`` for FP8 rows, encoded on the way in.
        comp_table: int32 ``[num_seqs, max_blocks]`` compressed page per logical block, -1 = none.
        seq_idx, entry_idx: int32 ``[num_entries]``; -1 in either marks padding.
        entries_per_block: ``block_size // ratio``; pages_per_chunk, chunk_rows: the chunk packing.
        codec: None for plain rows, else the FP8 layout of the byte rows (``Fp8DsMlaLayout`` or
            ``Fp8IndexKeyLayout``).

    Raises ValueError before launch on a wrong dtype, shape, layout or out-of-range value.
    """
    _check(entries, rows, comp_table, seq_idx, entry_idx, entries_per_block, pages_per_chunk, chunk_rows, codec)
    require_triton("compressed_write")
    if entries.shape[0] == 0:
        return
    bt, bw = launch_tiles(entries.device, entries.shape[1])
    grid = (triton.cdiv(entries.shape[0], bt),)
    _compressed_write_kernel[grid](entries, rows, comp_table, seq_idx, entry_idx, entries.shape[0],
                                   entries.shape[1], entries.stride(0), rows.stride(0), comp_table.stride(0),
                                   entries_per_block, pages_per_chunk, chunk_rows, BLOCK_T=bt, BLOCK_W=bw,
                                   **codec_constexprs(codec, entries))
