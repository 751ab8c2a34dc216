"""Scatter a step's new K rows of one layer into the layer's paged SWA rows.

Addressing (fixed by the arena): the token of sequence ``s`` at absolute position ``pos`` lives in
physical row ``swa_table[s, pos // block_size] * row_stride + pos % block_size`` of the layer's row
view ``rows[num_rows, width]``. ``block_size`` is the token modulus, ``row_stride >= block_size`` the
physical distance between two SWA pages of the layer (in the fused c4 chunk the page also holds
other layers' rows and the CSA boundary state, so the two differ).

Sentinels: a table entry of -1 means "no page" and the token is skipped; it is never written and
never mapped to page 0. A token with ``seq_idx == -1`` or ``position == -1`` (CUDA-graph padding) is
skipped too. Each destination row must be written at most once per call.

Row formats: ``rows`` is a plain fp32/bf16 view (``codec=None``, rows are copied) or a uint8 view of
``fp8_ds_mla`` rows (``codec`` = its :class:`~atom.kernels.fp8_ds_mla.Fp8DsMlaLayout`; ``k`` holds fp32/bf16
values that are encoded in registers on the way in, see :mod:`atom.kernels.kv_rows`).

One entry point, a checked Triton wrapper with a torch reference of the same signature:
:func:`swa_write` / :func:`swa_write_ref`, per-token ``seq_idx`` and ``positions`` (the runner
flattens prefill chunks and decodes alike). Every row of a chunk is written, before attention reads
the window: the prefix cache publishes only fully written blocks. :func:`check_ragged` and
:func:`ragged_tokens` describe a ragged batch (``cu_seqlens``, ``pos_start``) for the compressor-state
kernels.
"""

from __future__ import annotations

import torch

from ._common import (HAS_TRITON, Redirect, check_index, check_range, check_same_device, check_swa_geometry,
                      launch_tiles, masked_redirect, max_swa_page, put_redirected, require_triton, triton, tl,
                      value_checks_enabled)
from .kv_rows import RowCodec, check_value_rows, codec_constexprs, encode_rows_ref
from .step_memo import memoized

__all__ = ["swa_write", "swa_write_ref", "check_ragged", "ragged_tokens"]


# ----------------------------------------------------------------------------------------------
# checks
# ----------------------------------------------------------------------------------------------

def _check_dest(k: torch.Tensor, rows: torch.Tensor, swa_table: torch.Tensor, block_size: int,
                row_stride: int, codec: RowCodec) -> None:
    check_swa_geometry(block_size, row_stride)
    check_value_rows("rows", rows, "k", k, codec)
    check_index("swa_table", swa_table, (None, None))
    n_pages = max_swa_page(rows.shape[0], block_size, row_stride)
    check_range("swa_table", swa_table, -1, n_pages,
                f"rows has {rows.shape[0]} rows = {n_pages} pages of row_stride {row_stride}; -1 = no page")


def _check_tokens(k, rows, swa_table, seq_idx, positions, block_size, row_stride, codec) -> None:
    _check_dest(k, rows, swa_table, block_size, row_stride, codec)
    check_index("seq_idx", seq_idx, (k.shape[0],))
    check_index("positions", positions, (k.shape[0],))
    check_same_device(k=k, rows=rows, swa_table=swa_table, seq_idx=seq_idx, positions=positions)
    check_range("seq_idx", seq_idx, -1, swa_table.shape[0], "a row of swa_table, or -1 = padding")
    check_range("positions", positions, -1, swa_table.shape[1] * block_size,
                "positions covered by swa_table's logical blocks, or -1 = padding")


def check_ragged(k_len: int, cu_seqlens: torch.Tensor, pos_start: torch.Tensor, max_pos: int) -> int:
    """Check a ragged batch description; return the longest chunk (under ``value_checks_off``: ``k_len``, an
    upper bound, so that nothing is read back). Shared with compressor_state."""
    check_index("cu_seqlens", cu_seqlens, (None,))
    num_seqs = cu_seqlens.shape[0] - 1
    if num_seqs < 0:
        raise ValueError("cu_seqlens must have num_seqs + 1 >= 1 entries")
    check_index("pos_start", pos_start, (num_seqs,))
    if num_seqs == 0:
        return 0
    if not value_checks_enabled():
        return k_len  # an upper bound that needs no device read (launch grids mask past each chunk's end);
        # the range checks below compute tensors (the chunk lengths), device work skipped with them
    lens = cu_seqlens[1:] - cu_seqlens[:-1]
    check_range("cu_seqlens", cu_seqlens, 0, k_len + 1, "token offsets into the batch")
    check_range("chunk lengths cu_seqlens[1:] - cu_seqlens[:-1]", lens, 0, k_len + 1, "must not decrease")
    check_range("pos_start", pos_start, 0, max_pos + 1, "absolute position of each chunk's first token")
    check_range("pos_start + chunk length", pos_start + lens, 0, max_pos + 1, "covered by the table")
    return int(lens.max())


@memoized
def ragged_tokens(cu_seqlens: torch.Tensor, pos_start: torch.Tensor, keep_last: int | None, num_tokens: int
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(token index, sequence index, position, keep) of the ``num_tokens`` tokens of a ragged batch, in token
    order; shapes depend only on ``num_tokens`` (nothing is read back). Once per step and argument list inside
    :func:`~.step_memo.step_memo` (the results are shared: not to be written into).

    ``keep`` is true for every token, or with ``keep_last`` for the last ``keep_last`` tokens of each chunk.
    """
    num_seqs = cu_seqlens.shape[0] - 1
    tok = torch.arange(num_tokens if num_seqs > 0 else 0, device=cu_seqlens.device)
    cu = cu_seqlens.long()
    seq = torch.searchsorted(cu[1:], tok, right=True).clamp(max=max(num_seqs - 1, 0))
    local = tok - cu[:-1][seq]
    pos = pos_start.long()[seq] + local
    keep = (tok >= cu[0]) & (tok < cu[-1])  # rows of ``k`` outside the described chunks are not tokens
    if keep_last is not None:
        lens = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
        keep = keep & (local >= lens[seq] - keep_last)
    return tok, seq, pos, keep


# ----------------------------------------------------------------------------------------------
# torch references
# ----------------------------------------------------------------------------------------------

@memoized
def _token_rows(swa_table: torch.Tensor, seq_idx: torch.Tensor, positions: torch.Tensor, block_size: int,
                row_stride: int) -> Redirect:
    """Where each token's row goes (a :func:`masked_redirect` of its physical row and whether it is written):
    index arithmetic only, the same for every layer of a step (:mod:`.step_memo`)."""
    seq, pos = seq_idx.long(), positions.long()
    page = swa_table[seq.clamp(min=0), pos.clamp(min=0) // block_size].long()
    keep = (seq_idx >= 0) & (positions >= 0) & (page >= 0)
    return masked_redirect((page * row_stride + pos % block_size,), keep)


def swa_write_ref(k: torch.Tensor, rows: torch.Tensor, swa_table: torch.Tensor, seq_idx: torch.Tensor,
                  positions: torch.Tensor, *, block_size: int, row_stride: int, codec: RowCodec = None) -> None:
    """Torch reference of :func:`swa_write` (same contract)."""
    _check_tokens(k, rows, swa_table, seq_idx, positions, block_size, row_stride, codec)
    put_redirected(((rows, encode_rows_ref(k, codec)),), _token_rows(swa_table, seq_idx, positions, block_size,
                                                                      row_stride))


# ----------------------------------------------------------------------------------------------
# Triton
# ----------------------------------------------------------------------------------------------

if HAS_TRITON:
    from .kv_rows import store_rows, token_slots

    @triton.jit
    def _swa_write_tokens_kernel(k_ptr, rows_ptr, table_ptr, seq_ptr, pos_ptr, num_tokens, width,
                                 k_stride, rows_stride, table_stride, block_size, row_stride,
                                 BLOCK_T: tl.constexpr, BLOCK_W: tl.constexpr, FMT: tl.constexpr, NOPE: tl.constexpr,
                                 ROPE: tl.constexpr, QBLOCK: tl.constexpr, PAD: tl.constexpr, PAD_P2: tl.constexpr,
                                 X_IS_BF16: tl.constexpr):
        t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
        ok, pos, dst = token_slots(seq_ptr, pos_ptr, table_ptr, t, num_tokens, table_stride, block_size, row_stride,
                                   rows_stride)
        store_rows(k_ptr, t.to(tl.int64) * k_stride, rows_ptr, dst, ok, width, BLOCK_W, FMT, NOPE, ROPE, QBLOCK,
                   PAD, PAD_P2, X_IS_BF16)


def swa_write(k: torch.Tensor, rows: torch.Tensor, swa_table: torch.Tensor, seq_idx: torch.Tensor,
              positions: torch.Tensor, *, block_size: int, row_stride: int, codec: RowCodec = None) -> None:
    """Write ``k[t]`` into the SWA row of token ``t`` (sequence ``seq_idx[t]``, position ``positions[t]``).

    Args:
        k: ``[num_tokens, width]`` new rows, same dtype as ``rows`` (fp32/bf16 values of ``codec``'s width
            for a byte view), inner dim contiguous.
        rows: ``[num_rows, width]`` the layer's SWA row view (any row stride, inner dim contiguous); uint8
            ``[num_rows, codec.row_bytes]`` for ``fp8_ds_mla`` rows, which are encoded on the way in.
        swa_table: int32 ``[num_seqs, max_blocks]`` physical SWA page per logical block, -1 = none.
        seq_idx, positions: int32 ``[num_tokens]``; -1 in either marks a padding token (skipped).
        block_size: tokens per logical block (the position modulus).
        row_stride: physical rows between consecutive SWA pages of the layer (>= block_size).
        codec: None for plain fp32/bf16 rows, else the :class:`Fp8DsMlaLayout` of the byte rows.

    Raises ValueError before launch on a wrong dtype, shape, layout or an out-of-range value.
    """
    _check_tokens(k, rows, swa_table, seq_idx, positions, block_size, row_stride, codec)
    require_triton("swa_write")
    if k.shape[0] == 0:
        return
    bt, bw = launch_tiles(k.device, k.shape[1])
    grid = (triton.cdiv(k.shape[0], bt),)
    _swa_write_tokens_kernel[grid](k, rows, swa_table, seq_idx, positions, k.shape[0], k.shape[1],
                                   k.stride(0), rows.stride(0), swa_table.stride(0), block_size, row_stride,
                                   BLOCK_T=bt, BLOCK_W=bw, **codec_constexprs(codec, k))
