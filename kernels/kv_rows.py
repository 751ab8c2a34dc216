"""The arena's row formats as the write and read kernels see them: store a row, load a tile of rows.

A row view is either *plain* (``codec=None``: fp32 / bf16 values, or raw bytes copied as they are) or a *byte* view (uint8) of one of
two FP8 formats, named by its codec layout:

* :class:`~atom.kernels.fp8_ds_mla.Fp8DsMlaLayout`: SWA and compressed KV rows (``fp8_ds_mla``);
* :class:`~atom.kernels.fp8_index_key.Fp8IndexKeyLayout`: lightning-indexer keys (``fp8``).

Writers (``swa_write``, ``compressed_write``) take fp32/bf16 values and, for a
byte view, encode them in registers on the way to the arena; readers (``sparse_attention``) decode
byte rows in registers into fp32 tiles. No kernel makes a dequantized copy of arena rows. The torch
references encode / decode through the codec references, so both paths give the same bytes.
"""

from __future__ import annotations

from typing import Union

import torch

from ._common import HAS_TRITON, VALUE_DTYPES, check_rows, next_pow2, triton, tl
from .fp8_ds_mla import Fp8DsMlaLayout, fp8_ds_mla_dequantize_ref, fp8_ds_mla_quantize_ref
from .fp8_index_key import Fp8IndexKeyLayout, fp8_index_key_dequantize_ref, fp8_index_key_quantize_ref

__all__ = ["RowCodec", "check_value_rows", "codec_constexprs", "encode_rows_ref", "decode_rows_ref", "row_width"]

RowCodec = Union[Fp8DsMlaLayout, Fp8IndexKeyLayout, None]

_PLAIN, _DS_MLA, _INDEX = 0, 1, 2


def row_width(rows: torch.Tensor, codec: RowCodec) -> int:
    """Values per row: the view's width for plain rows, the codec's ``dim`` for byte rows."""
    if codec is None:
        return rows.shape[1]
    return codec.dim if isinstance(codec, Fp8IndexKeyLayout) else codec.nope + codec.rope


def _check_codec(codec: RowCodec) -> None:
    if not isinstance(codec, (Fp8DsMlaLayout, Fp8IndexKeyLayout)):
        raise ValueError(f"codec must be an Fp8DsMlaLayout, an Fp8IndexKeyLayout or None, got {codec!r}")
    codec.check()
    if isinstance(codec, Fp8DsMlaLayout):
        for name, value in (("qblock", codec.qblock), ("rope", codec.rope)):
            if next_pow2(value) != value:
                raise ValueError(f"the fp8_ds_mla kernels need a power-of-two {name}, got {value}")


def check_value_rows(rows_name: str, rows: torch.Tensor, vals_name: str, vals: torch.Tensor | None,
                     codec: RowCodec, *, ndim: int = 2) -> None:
    """``rows`` is a row view in ``codec``'s format; ``vals`` (``ndim`` dims, or None) holds values of its rows.

    Plain (any row dtype; uint8 rows are then copied as raw bytes): ``vals`` has ``rows``' dtype and
    width. Byte rows of a codec: ``rows`` is uint8 of ``codec.row_bytes``
    and ``vals`` fp32/bf16 of ``codec``'s value width."""
    if codec is None:
        check_rows(rows_name, rows)
        if vals is not None:
            check_rows(vals_name, vals, ndim=ndim, dtype=rows.dtype, width=rows.shape[1])
        return
    _check_codec(codec)
    check_rows(rows_name, rows, dtype=torch.uint8, width=codec.row_bytes)
    if vals is not None:
        check_rows(vals_name, vals, ndim=ndim, dtypes=VALUE_DTYPES, width=row_width(rows, codec))


def codec_constexprs(codec: RowCodec, vals: torch.Tensor | None = None) -> dict:
    """The compile-time constants the Triton helpers below take for ``codec``."""
    if codec is None:
        return dict(FMT=_PLAIN, NOPE=1, ROPE=1, QBLOCK=1, PAD=0, PAD_P2=1, X_IS_BF16=False)
    bf16 = vals is not None and vals.dtype == torch.bfloat16
    if isinstance(codec, Fp8IndexKeyLayout):
        return dict(FMT=_INDEX, NOPE=codec.dim, ROPE=1, QBLOCK=next_pow2(codec.dim), PAD=0, PAD_P2=1, X_IS_BF16=bf16)
    pad = codec.row_bytes - codec.scale_off - codec.n_scales
    return dict(FMT=_DS_MLA, NOPE=codec.nope, ROPE=codec.rope, QBLOCK=codec.qblock, PAD=pad, PAD_P2=next_pow2(pad),
                X_IS_BF16=bf16)


def encode_rows_ref(x: torch.Tensor, codec: RowCodec) -> torch.Tensor:
    """The bytes (or, plain, the values) a writer stores for value rows ``x``."""
    if codec is None:
        return x
    if isinstance(codec, Fp8IndexKeyLayout):
        return fp8_index_key_quantize_ref(x.contiguous(), layout=codec)
    return fp8_ds_mla_quantize_ref(x.contiguous(), layout=codec)


def decode_rows_ref(rows: torch.Tensor, codec: RowCodec) -> torch.Tensor:
    """fp32 values of (gathered) rows ``rows``."""
    if codec is None:
        return rows.float()
    if isinstance(codec, Fp8IndexKeyLayout):
        return fp8_index_key_dequantize_ref(rows.contiguous(), layout=codec)
    return fp8_ds_mla_dequantize_ref(rows.contiguous(), out_dtype=torch.float32, layout=codec)


if HAS_TRITON:
    from ._common import copy_rows
    from .fp8_ds_mla import load_ds_mla_tile, store_ds_mla_rows
    from .fp8_index_key import load_index_key_tile, store_index_key_rows

    @triton.jit
    def token_page(seq_ptr, idx_ptr, table_ptr, t, num_tokens, table_stride, per_page):
        """``(ok, idx, page)`` of tokens ``t``: whether each has a sequence, an index and a page (padding tokens
        carry -1 in ``seq_ptr`` or ``idx_ptr``, a missing page is -1 in the table), its index (a position, or
        a compressed entry), and its page ``table[seq, idx // per_page]`` as int64."""
        ok = t < num_tokens
        seq = tl.load(seq_ptr + t, mask=ok, other=-1)
        idx = tl.load(idx_ptr + t, mask=ok, other=-1)
        ok = ok & (seq >= 0) & (idx >= 0)
        page = tl.load(table_ptr + seq.to(tl.int64) * table_stride + idx // per_page, mask=ok, other=-1)
        ok = ok & (page >= 0)
        return ok, idx, page.to(tl.int64)

    @triton.jit
    def token_slots(seq_ptr, pos_ptr, table_ptr, t, num_tokens, table_stride, block_size, row_stride, rows_stride):
        """``(ok, pos, dst)`` of tokens ``t``: as :func:`token_page` with positions, and the element offset of
        each token's row in the paged rows (row ``pos % block_size`` of page ``table[seq, pos // block_size]``)."""
        ok, pos, page = token_page(seq_ptr, pos_ptr, table_ptr, t, num_tokens, table_stride, block_size)
        dst = (page * row_stride + pos % block_size) * rows_stride
        return ok, pos, dst

    @triton.jit
    def store_rows(src_ptr, src_off, dst_ptr, dst_off, ok, width, BLOCK_W: tl.constexpr, FMT: tl.constexpr,
                   NOPE: tl.constexpr, ROPE: tl.constexpr, QBLOCK: tl.constexpr, PAD: tl.constexpr,
                   PAD_P2: tl.constexpr, X_IS_BF16: tl.constexpr):
        """Store value rows at ``src_ptr + src_off[i]`` as arena rows at ``dst_ptr + dst_off[i]`` (rows with ok).

        Plain: a copy of ``width`` elements. FP8: offsets are in elements of the source / bytes of the row."""
        if FMT == 0:
            copy_rows(src_ptr, src_off, dst_ptr, dst_off, ok, width, BLOCK_W)
        elif FMT == 1:
            store_ds_mla_rows(src_ptr, src_off, dst_ptr, dst_off, ok, NOPE, ROPE, QBLOCK, PAD, PAD_P2, X_IS_BF16)
        else:
            store_index_key_rows(src_ptr, src_off, dst_ptr, dst_off, ok, NOPE, QBLOCK)

    @triton.jit
    def load_rows(rows_ptr, row_off, valid, d, width, FMT: tl.constexpr, NOPE: tl.constexpr, ROPE: tl.constexpr,
                  QBLOCK: tl.constexpr, ALIGNED: tl.constexpr = False):
        """fp32 tile ``[len(row_off), len(d)]`` of dims ``d`` of the rows at ``rows_ptr + row_off[i]``.

        Rows without ``valid`` and dims ``d >= width`` (the value width) read as 0. ``ALIGNED``: every byte
        row starts at an even byte (``fp8_ds_mla`` rows then read their bf16 part with 16-bit loads)."""
        if FMT == 0:
            x = tl.load(rows_ptr + row_off[:, None] + d[None, :], mask=valid[:, None] & (d[None, :] < width),
                        other=0.0).to(tl.float32)
        elif FMT == 1:
            x = load_ds_mla_tile(rows_ptr, row_off, valid, d, NOPE, ROPE, QBLOCK, ALIGNED)
        else:
            x = load_index_key_tile(rows_ptr, row_off, valid, d, NOPE)
        return x
