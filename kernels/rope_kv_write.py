"""A step's new K=V rows rotated, rounded as stored and written to their SWA rows, in one launch.

The attention's K=V row leaves ``wkv`` (or ``kv_norm``) un-rotated. Before it reaches the arena it takes, in this
order:

0. with ``norm_weight`` given, ``kv_norm``: the RMSNorm of :mod:`.rms_norm` (``x * rsqrt(mean(x^2) + norm_eps) *
   norm_weight`` in fp32, rounded to ``kv.dtype``);
1. RoPE on its last ``R = 2 * len(freqs)`` dims (``rope``: pairs rotated by ``position * freq`` in fp32, the
   result cast back to ``kv.dtype``);
2. with ``fp8_block > 0`` (the release numerics, ``quant_sim``) the stored row's round trip: the first
   ``D - R`` (NoPE) dims through FP8-e4m3 with one power-of-two scale per ``fp8_block`` values, the RoPE dims
   through bf16 (``kv_row_roundtrip`` of the model; back in ``kv.dtype``);
3. the write of ``swa_write``: cast to the view's dtype for value rows, or encoded as ``fp8_ds_mla`` bytes for a
   byte view (``codec``), at row ``swa_table[seq, pos // block_size] * row_stride + pos % block_size``.

:func:`rope_kv_write_ref` is exactly that chain of torch ops (``rms_norm_ref``, ``rope_ref``, the round trip,
``swa_write_ref``), so it equals the unfused path value for value. :func:`rope_kv_write` does them all in registers,
one program per tile of tokens: the norm's sum of squares over each whole row as the ``rms_norm`` kernel reduces it
(one tile of the row), then the RoPE dims are rotated with the ``rope`` kernel's own arithmetic (``rotate_pairs``),
then each NoPE block is loaded (normed), round-tripped and cast or encoded, so on one device it writes the bytes
the ``rms_norm`` kernel, the ``rope`` kernel, the round trip and ``swa_write`` write one after the other. Against the torch reference the
NoPE values (bytes, scales) are identical and the RoPE dims can differ where the device's ``cos`` / ``sin``
differ from torch's in the last fp32 bit (by a few fp32 units; after a rounding to bf16, by at most one bf16
unit).

Sentinels and one write per destination row as in ``swa_write``: ``seq_idx`` or ``positions`` -1 (padding) and
table entries -1 skip a token; ``positions`` are both the rotation angle's position and the slot's.
"""

from __future__ import annotations

import torch

from ._common import (HAS_TRITON, check_index, check_range, check_rows, check_same_device,
                      check_swa_geometry, max_swa_page, next_pow2, require_triton, triton, tl)
from .fp8_ds_mla import Fp8DsMlaLayout
from .kv_rows import check_value_rows
from .quant_formats import fp8_roundtrip
from .rms_norm import _check as check_norm, rms_norm_ref
from .rope import rope_ref
from .swa_write import swa_write_ref
from .tiles import tiles_for

__all__ = ["rope_kv_write", "rope_kv_write_ref"]

_VALUE_DTYPES = (torch.float32, torch.bfloat16)  # the model's rows (a GPU backend never runs float64)
_PLAIN_ROWS = (torch.float32, torch.bfloat16)  # value views of the arena
_PLAIN_TILE = 64  # NoPE columns per step of a value row without the round trip


def _check(kv: torch.Tensor, rows: torch.Tensor, swa_table: torch.Tensor, seq_idx: torch.Tensor,
           positions: torch.Tensor, freqs: torch.Tensor, block_size: int, row_stride: int, fp8_block: int,
           codec: Fp8DsMlaLayout | None, norm_weight: torch.Tensor | None, norm_eps: float) -> None:
    check_rows("kv", kv, dtypes=_VALUE_DTYPES)
    width = kv.shape[1]
    if norm_weight is not None:
        check_norm(kv, norm_weight, norm_eps)
    if not isinstance(freqs, torch.Tensor) or freqs.dim() != 1 or freqs.dtype != torch.float32:
        raise ValueError(f"freqs must be a 1-d fp32 tensor, got {getattr(freqs, 'dtype', type(freqs).__name__)} "
                         f"{tuple(getattr(freqs, 'shape', ()))}")
    rope = 2 * freqs.shape[0]
    if not 0 < rope <= width:
        raise ValueError(f"2 * len(freqs) = {rope} must be in 1..{width} (the width of kv)")
    nope = width - rope
    if not isinstance(fp8_block, int) or fp8_block < 0:
        raise ValueError(f"fp8_block must be an int >= 0 (0: no FP8 round trip), got {fp8_block!r}")
    if fp8_block and (nope % fp8_block or next_pow2(fp8_block) != fp8_block):
        raise ValueError(f"fp8_block={fp8_block} must be a power of two dividing the {nope} NoPE dims of kv")
    if codec is None:
        check_rows("rows", rows, dtypes=_PLAIN_ROWS, width=width)
    else:
        if not isinstance(codec, Fp8DsMlaLayout):
            raise ValueError(f"codec must be an Fp8DsMlaLayout (fp8_ds_mla rows) or None, got {codec!r}")
        if (codec.nope, codec.rope) != (nope, rope):
            raise ValueError(f"codec {codec} stores {codec.nope} NoPE + {codec.rope} RoPE dims; kv has {nope} + "
                             f"{rope} (width {width}, 2 * len(freqs) = {rope})")
        check_value_rows("rows", rows, "kv", None, codec)
        if fp8_block and fp8_block != codec.qblock:
            raise ValueError(f"fp8_block={fp8_block} must equal the codec's qblock={codec.qblock} (the round "
                             "trip and the stored scales share their blocks)")
    check_swa_geometry(block_size, row_stride)
    check_index("swa_table", swa_table, (None, None))
    check_index("seq_idx", seq_idx, (kv.shape[0],))
    check_index("positions", positions, (kv.shape[0],))
    check_same_device(kv=kv, rows=rows, swa_table=swa_table, seq_idx=seq_idx, positions=positions, freqs=freqs,
                      norm_weight=kv if norm_weight is None else norm_weight)
    n_pages = max_swa_page(rows.shape[0], block_size, row_stride)
    check_range("swa_table", swa_table, -1, n_pages,
                f"rows has {rows.shape[0]} rows = {n_pages} pages of row_stride {row_stride}; -1 = no page")
    check_range("seq_idx", seq_idx, -1, swa_table.shape[0], "a row of swa_table, or -1 = padding")
    check_range("positions", positions, -1, swa_table.shape[1] * block_size,
                "positions covered by swa_table's logical blocks, or -1 = padding")


def rope_kv_write_ref(kv: torch.Tensor, rows: torch.Tensor, swa_table: torch.Tensor, seq_idx: torch.Tensor,
                      positions: torch.Tensor, freqs: torch.Tensor, *, block_size: int, row_stride: int,
                      fp8_block: int = 0, codec: Fp8DsMlaLayout | None = None,
                      norm_weight: torch.Tensor | None = None, norm_eps: float = 0.0) -> None:
    """Torch reference of :func:`rope_kv_write` (same contract): the unfused chain of ops."""
    _check(kv, rows, swa_table, seq_idx, positions, freqs, block_size, row_stride, fp8_block, codec, norm_weight,
           norm_eps)
    if norm_weight is not None:
        kv = rms_norm_ref(kv, norm_weight, norm_eps)
    y = rope_ref(kv, positions, freqs)
    if fp8_block:
        nope = kv.shape[1] - 2 * freqs.shape[0]
        y = torch.cat((fp8_roundtrip(y[:, :nope], fp8_block), y[:, nope:].to(torch.bfloat16).to(y.dtype)), dim=1)
    values = y if codec is not None else y.to(rows.dtype)
    swa_write_ref(values.contiguous(), rows, swa_table, seq_idx, positions, block_size=block_size,
                  row_stride=row_stride, codec=codec)


if HAS_TRITON:
    from .quant_formats import e4m3_bits, ue8m0_exponent
    from .rope import rotate_pairs
    from .kv_rows import token_slots
    from .store_rounding import rounded_for

    @triton.jit
    def _bf16_value(v):
        """fp32 ``v`` rounded to the nearest bf16 (ties to even) on the bits, kept as fp32."""
        u = v.to(tl.uint32, bitcast=True)
        return ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).to(tl.float32, bitcast=True)

    @triton.jit
    def _pow2(e):
        """fp32 ``2**e`` of int32 exponents in the normal range, from the exponent bits."""
        return ((e + 127) << 23).to(tl.float32, bitcast=True)

    @triton.jit
    def _fp8_roundtrip(v):
        """Each row of the fp32 block ``v [rows, block]`` quantised to e4m3 at its power-of-two scale and back."""
        e = ue8m0_exponent(tl.max(tl.abs(v), axis=1))
        q = e4m3_bits(v * _pow2(-e)[:, None]).to(tl.float8e4nv, bitcast=True).to(tl.float32)
        return q * _pow2(e)[:, None]

    @triton.jit
    def _kv_normed(v, inv, w_ptr, col, X_IS_BF16: tl.constexpr, NORM: tl.constexpr):
        """``kv_norm`` of the fp32 values ``v`` at columns ``col``: ``v * inv * weight`` rounded to kv's dtype (as
        the ``rms_norm`` kernel stores it), back in fp32; ``v`` itself without ``NORM``."""
        if NORM:
            v = v * inv[:, None] * tl.load(w_ptr + col).to(tl.float32)[None, :]
            if X_IS_BF16:
                v = _bf16_value(v)
        return v

    @triton.jit
    def _rope_dims(x_ptr, freq_ptr, rows_ptr, w_ptr, src, dst, ok, pos, inv, sign, BLOCK_T: tl.constexpr,
                   NOPE: tl.constexpr, ROPE: tl.constexpr, ROPE_P2: tl.constexpr, QB: tl.constexpr,
                   ROUNDTRIP: tl.constexpr, FMT: tl.constexpr, PAD: tl.constexpr, PAD_P2: tl.constexpr,
                   X_IS_BF16: tl.constexpr, NORM: tl.constexpr):
        """The RoPE dims of a tile of rows: (normed,) rotated as the rope kernel rotates, cast to kv's dtype, then
        bf16 (round trip, encode), stored; with ``fp8_ds_mla`` rows also the row's padding bytes."""
        r = tl.arange(0, ROPE_P2)
        live = r < ROPE
        odd = r % 2
        m = ok[:, None] & live[None, :]
        x = tl.load(x_ptr + src[:, None] + NOPE + r[None, :], mask=m, other=0.0).to(tl.float32)
        xp = tl.load(x_ptr + src[:, None] + NOPE + (r + 1 - 2 * odd)[None, :], mask=m, other=0.0).to(tl.float32)
        x = _kv_normed(x, inv, w_ptr, NOPE + tl.where(live, r, 0), X_IS_BF16, NORM)
        xp = _kv_normed(xp, inv, w_ptr, NOPE + tl.where(live, r + 1 - 2 * odd, 0), X_IS_BF16, NORM)
        freq = tl.load(freq_ptr + r // 2, mask=live, other=0.0)
        y = rotate_pairs(x, xp, pos.to(tl.float32), freq, odd, sign)
        if X_IS_BF16 or ROUNDTRIP or FMT == 1:
            y = _bf16_value(y)
        if FMT == 1:
            bits = (y.to(tl.uint32, bitcast=True) >> 16).to(tl.int32)
            tl.store(rows_ptr + dst[:, None] + NOPE + 2 * r[None, :], (bits & 0xFF).to(tl.uint8), mask=m)
            tl.store(rows_ptr + dst[:, None] + NOPE + 2 * r[None, :] + 1, ((bits >> 8) & 0xFF).to(tl.uint8), mask=m)
            if PAD > 0:
                p = tl.arange(0, PAD_P2)
                tl.store(rows_ptr + dst[:, None] + NOPE + 2 * ROPE + NOPE // QB + p[None, :],
                         tl.zeros([BLOCK_T, PAD_P2], dtype=tl.uint8), mask=ok[:, None] & (p[None, :] < PAD))
        else:
            tl.store(rows_ptr + dst[:, None] + NOPE + r[None, :], rounded_for(y, rows_ptr.dtype.element_ty), mask=m)

    @triton.jit
    def _nope_dims(x_ptr, rows_ptr, w_ptr, src, dst, ok, inv, BLOCK_T: tl.constexpr, NOPE: tl.constexpr,
                   ROPE: tl.constexpr, QB: tl.constexpr, ROUNDTRIP: tl.constexpr, FMT: tl.constexpr,
                   X_IS_BF16: tl.constexpr, NORM: tl.constexpr):
        """The NoPE dims of a tile of rows, one block (FP8 scale group) per step: (normed,) round-tripped, stored
        or encoded."""
        c = tl.arange(0, QB)
        for b in tl.static_range((NOPE + QB - 1) // QB):
            col = b * QB + c
            m = ok[:, None] & (col < NOPE)[None, :]
            v = tl.load(x_ptr + src[:, None] + col[None, :], mask=m, other=0.0).to(tl.float32)
            v = _kv_normed(v, inv, w_ptr, tl.where(col < NOPE, col, 0), X_IS_BF16, NORM)
            if ROUNDTRIP:
                v = _fp8_roundtrip(v)
            if FMT == 1:
                e = ue8m0_exponent(tl.max(tl.abs(v), axis=1))
                tl.store(rows_ptr + dst[:, None] + col[None, :], e4m3_bits(v * _pow2(-e)[:, None]), mask=m)
                tl.store(rows_ptr + dst + NOPE + 2 * ROPE + b, (e + 127).to(tl.uint8), mask=ok)
            else:
                tl.store(rows_ptr + dst[:, None] + col[None, :], rounded_for(v, rows_ptr.dtype.element_ty), mask=m)

    @triton.jit
    def _rope_kv_write_kernel(x_ptr, pos_ptr, freq_ptr, seq_ptr, table_ptr, rows_ptr, w_ptr, num_tokens, x_stride,
                              rows_stride, table_stride, block_size, row_stride, sign, width, eps,
                              BLOCK_T: tl.constexpr, NOPE: tl.constexpr, ROPE: tl.constexpr,
                              ROPE_P2: tl.constexpr, QB: tl.constexpr, ROUNDTRIP: tl.constexpr,
                              FMT: tl.constexpr, PAD: tl.constexpr, PAD_P2: tl.constexpr, X_IS_BF16: tl.constexpr,
                              NORM: tl.constexpr, WIDTH_P2: tl.constexpr):
        t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
        ok, pos, dst = token_slots(seq_ptr, pos_ptr, table_ptr, t, num_tokens, table_stride, block_size, row_stride,
                                   rows_stride)  # dst: elements (bytes) of rows
        src = t.to(tl.int64) * x_stride
        inv = tl.zeros([BLOCK_T], dtype=tl.float32)
        if NORM:  # the rms_norm kernel's reduction: the whole row in one tile
            d = tl.arange(0, WIDTH_P2)
            xa = tl.load(x_ptr + src[:, None] + d[None, :], mask=ok[:, None] & (d < width)[None, :],
                         other=0.0).to(tl.float32)
            inv = 1.0 / tl.sqrt(tl.sum(xa * xa, axis=1) / width + eps)
        # the RoPE dims and the NoPE blocks, in the order that keeps sm90 from spilling (4 bytes around the slow
        # path of cos / sin in the other order: RoPE first without the norm, NoPE first with it)
        if NORM:
            _nope_dims(x_ptr, rows_ptr, w_ptr, src, dst, ok, inv, BLOCK_T, NOPE, ROPE, QB, ROUNDTRIP, FMT, X_IS_BF16,
                       NORM)
            _rope_dims(x_ptr, freq_ptr, rows_ptr, w_ptr, src, dst, ok, pos, inv, sign, BLOCK_T, NOPE, ROPE, ROPE_P2,
                       QB, ROUNDTRIP, FMT, PAD, PAD_P2, X_IS_BF16, NORM)
        else:
            _rope_dims(x_ptr, freq_ptr, rows_ptr, w_ptr, src, dst, ok, pos, inv, sign, BLOCK_T, NOPE, ROPE, ROPE_P2,
                       QB, ROUNDTRIP, FMT, PAD, PAD_P2, X_IS_BF16, NORM)
            _nope_dims(x_ptr, rows_ptr, w_ptr, src, dst, ok, inv, BLOCK_T, NOPE, ROPE, QB, ROUNDTRIP, FMT, X_IS_BF16,
                       NORM)


def rope_kv_write(kv: torch.Tensor, rows: torch.Tensor, swa_table: torch.Tensor, seq_idx: torch.Tensor,
                  positions: torch.Tensor, freqs: torch.Tensor, *, block_size: int, row_stride: int,
                  fp8_block: int = 0, codec: Fp8DsMlaLayout | None = None,
                  norm_weight: torch.Tensor | None = None, norm_eps: float = 0.0) -> None:
    """Norm, rotate, round and write the new K=V rows ``kv`` to their SWA rows in one launch (module docstring).

    Args:
        kv: ``[num_tokens, D]`` fp32/bf16 rows before RoPE (inner dim contiguous, any row stride).
        rows: the layer's SWA row view: fp32/bf16 ``[num_rows, D]``, or uint8 ``[num_rows, codec.row_bytes]``
            of ``fp8_ds_mla`` rows (any row stride, inner dim contiguous).
        swa_table: int32 ``[num_seqs, max_blocks]`` physical SWA page per logical block, -1 = none.
        seq_idx, positions: int32 ``[num_tokens]``; -1 in either marks a padding token (skipped). ``positions``
            are the rotation's positions too.
        freqs: fp32 ``[R / 2]`` the layer's inverse frequencies (``R`` RoPE dims at the end of each row).
        block_size, row_stride: the SWA addressing of ``swa_write``.
        fp8_block: 0, or the block of the release's FP8 round trip of the NoPE dims (a power of two dividing
            ``D - R``; equal to ``codec.qblock`` with a codec).
        codec: None for value rows, else the :class:`Fp8DsMlaLayout` of the byte rows (``nope = D - R``,
            ``rope = R``).
        norm_weight, norm_eps: ``kv_norm``'s ``[D]`` weight (fp32/bf16) and epsilon (a float >= 0): the rows are
            RMS-normalised first; None: ``kv`` is already normed.

    Raises ValueError before launch on a wrong dtype, shape, layout or an out-of-range value.
    """
    _check(kv, rows, swa_table, seq_idx, positions, freqs, block_size, row_stride, fp8_block, codec, norm_weight,
           norm_eps)
    require_triton("rope_kv_write")
    if kv.shape[0] == 0:
        return
    rope = 2 * freqs.shape[0]
    nope = kv.shape[1] - rope
    if codec is not None:
        qb, pad = codec.qblock, codec.row_bytes - codec.scale_off - codec.n_scales
    else:
        qb, pad = fp8_block or min(next_pow2(nope), _PLAIN_TILE), 0
    bt = tiles_for(kv.device).copy_rows
    _rope_kv_write_kernel[(triton.cdiv(kv.shape[0], bt),)](
        kv, positions, freqs.contiguous(), seq_idx, swa_table, rows,
        kv if norm_weight is None else norm_weight.contiguous(),  # an unused pointer without the norm
        kv.shape[0], kv.stride(0), rows.stride(0), swa_table.stride(0), block_size, row_stride, 1.0, kv.shape[1],
        float(norm_eps), BLOCK_T=bt, NOPE=nope, ROPE=rope, ROPE_P2=next_pow2(rope), QB=qb, ROUNDTRIP=fp8_block > 0,
        FMT=0 if codec is None else 1, PAD=pad, PAD_P2=next_pow2(pad), X_IS_BF16=kv.dtype == torch.bfloat16,
        NORM=norm_weight is not None, WIDTH_P2=next_pow2(kv.shape[1]))
