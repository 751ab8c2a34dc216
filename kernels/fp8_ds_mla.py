"""The ``fp8_ds_mla`` KV row codec: quantize a latent KV row into bytes and back.

Row layout (real DSV4: 448 NoPE + 64 RoPE dims -> 584 bytes)::

    [0, nope)                      fp8 e4m3fn NoPE values, value / 2**e_b for its 64-wide block b
    [nope, nope + 2*rope)          RoPE dims as raw bf16 (little endian)
    [nope + 2*rope, + nope/qblock) one ue8m0 byte per NoPE block: e_b + 127
    then zero padding up to a multiple of 8 bytes (1 byte for the real geometry)

Scales are powers of two (ue8m0): ``e_b = ceil(log2(max(amax_b, 1e-4) / 448))`` computed from the
fp32 bits (the rule of :mod:`~atom.kernels.quant_formats`, shared with ``fp8_index_key``), so torch
and Triton agree bit for bit. fp8 encoding is round-to-nearest-even and saturates at 448 (torch's ``.to(float8_e4m3fn)``); the
Triton body encodes in software because the interpreter's fp32->fp8 cast is wrong
(triton_on_cpu.md 2.3-2.4). RoPE dims given in fp32 are rounded to bf16 to nearest even, also in
software. Dequantized values ``fp8 * 2**e_b`` are exact in bf16 and fp32.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ._common import HAS_TRITON, check_positive, check_rows, next_pow2, require_triton, triton, tl
from .tiles import tiles_for
from .quant_formats import check_row_encode, pow2_float, pow2_scale_exponent

if HAS_TRITON:
    from .quant_formats import e4m3_bits, ue8m0_exponent

__all__ = ["Fp8DsMlaLayout", "DSV4_LAYOUT", "fp8_ds_mla_quantize", "fp8_ds_mla_quantize_ref",
           "fp8_ds_mla_dequantize", "fp8_ds_mla_dequantize_ref"]

class Fp8DsMlaLayout(NamedTuple):
    """Geometry of one row: NoPE dims (fp8, blocks of ``qblock``) and RoPE dims (bf16)."""

    nope: int = 448
    rope: int = 64
    qblock: int = 64

    @property
    def dim(self) -> int:
        return self.nope + self.rope

    @property
    def n_scales(self) -> int:
        return self.nope // self.qblock

    @property
    def scale_off(self) -> int:
        return self.nope + 2 * self.rope

    @property
    def row_bytes(self) -> int:
        return -(-(self.scale_off + self.n_scales) // 8) * 8

    def check(self) -> None:
        check_positive("qblock", self.qblock)
        check_positive("rope", self.rope)
        if self.nope < self.qblock or self.nope % self.qblock or self.nope % 2:
            raise ValueError(f"nope={self.nope} must be an even positive multiple of qblock={self.qblock}")


DSV4_LAYOUT = Fp8DsMlaLayout()
assert DSV4_LAYOUT.row_bytes == 584


def _check_dequant(rows, out_dtype, layout) -> None:
    layout.check()
    check_rows("rows", rows, dtype=torch.uint8, width=layout.row_bytes)
    if out_dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"out_dtype must be float32 or bfloat16, got {out_dtype}")


def fp8_ds_mla_quantize_ref(x: torch.Tensor, out: torch.Tensor | None = None, *,
                            layout: Fp8DsMlaLayout = DSV4_LAYOUT) -> torch.Tensor:
    """Torch reference of :func:`fp8_ds_mla_quantize` (same contract)."""
    if out is None:
        out = torch.empty(x.shape[0], layout.row_bytes, dtype=torch.uint8, device=x.device)
    check_row_encode(x, out, layout)
    n = x.shape[0]
    nope = x[:, :layout.nope].float().view(n, layout.n_scales, layout.qblock)
    e = pow2_scale_exponent(nope.abs().amax(dim=-1))
    q = (nope * pow2_float(-e)[..., None]).to(torch.float8_e4m3fn).view(torch.uint8)
    out[:, :layout.nope] = q.view(n, layout.nope)
    out[:, layout.nope:layout.scale_off] = x[:, layout.nope:].to(torch.bfloat16).contiguous().view(torch.uint8)
    out[:, layout.scale_off:layout.scale_off + layout.n_scales] = (e + 127).to(torch.uint8)
    out[:, layout.scale_off + layout.n_scales:] = 0
    return out


def fp8_ds_mla_dequantize_ref(rows: torch.Tensor, *, out_dtype: torch.dtype = torch.bfloat16,
                              layout: Fp8DsMlaLayout = DSV4_LAYOUT) -> torch.Tensor:
    """Torch reference of :func:`fp8_ds_mla_dequantize` (same contract)."""
    _check_dequant(rows, out_dtype, layout)
    n = rows.shape[0]
    q = rows[:, :layout.nope].contiguous().view(torch.float8_e4m3fn).float().view(n, layout.n_scales, layout.qblock)
    e = rows[:, layout.scale_off:layout.scale_off + layout.n_scales].to(torch.int32) - 127
    nope = (q * pow2_float(e)[..., None]).view(n, layout.nope)
    rope = rows[:, layout.nope:layout.scale_off].contiguous().view(torch.bfloat16).float()
    return torch.cat([nope, rope], dim=1).to(out_dtype)


if HAS_TRITON:

    @triton.jit
    def store_ds_mla_rows(x_ptr, xo, out_ptr, oo, rm, NOPE: tl.constexpr, ROPE: tl.constexpr,
                          QBLOCK: tl.constexpr, PAD: tl.constexpr, PAD_P2: tl.constexpr, X_IS_BF16: tl.constexpr):
        """Encode the rows starting at ``x_ptr + xo[i]`` into the byte rows at ``out_ptr + oo[i]`` (rows with rm)."""
        c = tl.arange(0, QBLOCK)
        for b in tl.static_range(NOPE // QBLOCK):
            x = tl.load(x_ptr + xo[:, None] + b * QBLOCK + c[None, :], mask=rm[:, None], other=0.0).to(tl.float32)
            e = ue8m0_exponent(tl.max(tl.abs(x), axis=1))
            inv = ((127 - e) << 23).to(tl.float32, bitcast=True)
            tl.store(out_ptr + oo[:, None] + b * QBLOCK + c[None, :], e4m3_bits(x * inv[:, None]), mask=rm[:, None])
            tl.store(out_ptr + oo + 2 * ROPE + NOPE + b, (e + 127).to(tl.uint8), mask=rm)
        rc = tl.arange(0, ROPE)
        xr = tl.load(x_ptr + xo[:, None] + NOPE + rc[None, :], mask=rm[:, None], other=0.0)
        if X_IS_BF16:
            bits = xr.to(tl.int16, bitcast=True)
        else:  # round fp32 -> bf16 to nearest even in software (the interpreter's cast truncates)
            u = xr.to(tl.uint32, bitcast=True)
            bits = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).to(tl.uint16).to(tl.int16, bitcast=True)
        lo = (bits & 0xFF).to(tl.uint8)
        hi = ((bits >> 8) & 0xFF).to(tl.uint8)
        tl.store(out_ptr + oo[:, None] + NOPE + 2 * rc[None, :], lo, mask=rm[:, None])
        tl.store(out_ptr + oo[:, None] + NOPE + 2 * rc[None, :] + 1, hi, mask=rm[:, None])
        if PAD > 0:
            p = tl.arange(0, PAD_P2)
            tl.store(out_ptr + oo[:, None] + NOPE + 2 * ROPE + NOPE // QBLOCK + p[None, :],
                     tl.zeros([xo.shape[0], PAD_P2], dtype=tl.uint8), mask=rm[:, None] & (p[None, :] < PAD))

    @triton.jit
    def load_ds_mla_tile(rows_ptr, ro, valid, d, NOPE: tl.constexpr, ROPE: tl.constexpr, QBLOCK: tl.constexpr,
                         ALIGNED: tl.constexpr = False):
        """fp32 ``[len(ro), len(d)]``: dims ``d`` (``tl.arange(0, BLOCK_D)``, a multiple of ``QBLOCK``) of the
        byte rows at ``rows_ptr + ro[i]``, decoded in registers.

        Rows without ``valid`` and dims ``d >= NOPE + ROPE`` read as 0. Each row's scale bytes are loaded
        once (``[rows, BLOCK_D / QBLOCK]``) and broadcast over their blocks. ``ALIGNED`` (every row starts
        at an even byte) loads the RoPE values as bf16 through a cast pointer, one load per value; otherwise
        as two bytes each."""
        BLOCK_D: tl.constexpr = d.shape[0]
        NB: tl.constexpr = BLOCK_D // QBLOCK
        nope = d < NOPE
        rope = (d >= NOPE) & (d < NOPE + ROPE)
        q = tl.load(rows_ptr + ro[:, None] + d[None, :], mask=valid[:, None] & nope[None, :], other=0)
        b = tl.arange(0, NB)
        e = tl.load(rows_ptr + ro[:, None] + NOPE + 2 * ROPE + b[None, :],
                    mask=valid[:, None] & (b[None, :] < NOPE // QBLOCK), other=127)
        scale = (e.to(tl.int32) << 23).to(tl.float32, bitcast=True)  # [rows, NB]
        x = q.to(tl.float8e4nv, bitcast=True).to(tl.float32)
        x = tl.reshape(tl.reshape(x, [x.shape[0], NB, QBLOCK]) * scale[:, :, None], [x.shape[0], BLOCK_D])
        mr = valid[:, None] & rope[None, :]
        if ALIGNED:
            rope_ptr = (rows_ptr + ro[:, None] + NOPE).to(tl.pointer_type(tl.bfloat16))
            r = tl.load(rope_ptr + (d[None, :] - NOPE), mask=mr, other=0.0).to(tl.float32)
        else:
            rb = rows_ptr + ro[:, None] + NOPE + 2 * (d[None, :] - NOPE)
            lo = tl.load(rb, mask=mr, other=0).to(tl.int32)
            hi = tl.load(rb + 1, mask=mr, other=0).to(tl.int32)
            r = ((hi << 24) | (lo << 16)).to(tl.float32, bitcast=True)  # bf16 bits in the top half of an fp32
        return tl.where(nope[None, :], x, r)

    @triton.jit
    def _quant_kernel(x_ptr, out_ptr, n, x_stride, out_stride, NOPE: tl.constexpr, ROPE: tl.constexpr,
                      QBLOCK: tl.constexpr, PAD: tl.constexpr, PAD_P2: tl.constexpr, BLOCK_R: tl.constexpr,
                      X_IS_BF16: tl.constexpr):
        r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        store_ds_mla_rows(x_ptr, r.to(tl.int64) * x_stride, out_ptr, r.to(tl.int64) * out_stride, r < n,
                          NOPE, ROPE, QBLOCK, PAD, PAD_P2, X_IS_BF16)

    @triton.jit
    def _dequant_kernel(rows_ptr, out_ptr, n, rows_stride, out_stride, NOPE: tl.constexpr, ROPE: tl.constexpr,
                        QBLOCK: tl.constexpr, BLOCK_R: tl.constexpr):
        r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        rm = r < n
        ro = r.to(tl.int64) * rows_stride
        oo = r.to(tl.int64) * out_stride
        c = tl.arange(0, QBLOCK)
        for b in tl.static_range(NOPE // QBLOCK):
            q = tl.load(rows_ptr + ro[:, None] + b * QBLOCK + c[None, :], mask=rm[:, None], other=0)
            e = tl.load(rows_ptr + ro + NOPE + 2 * ROPE + b, mask=rm, other=127).to(tl.int32) - 127
            scale = ((e + 127) << 23).to(tl.float32, bitcast=True)
            x = q.to(tl.float8e4nv, bitcast=True).to(tl.float32) * scale[:, None]
            tl.store(out_ptr + oo[:, None] + b * QBLOCK + c[None, :], x.to(out_ptr.dtype.element_ty), mask=rm[:, None])
        rc = tl.arange(0, ROPE)
        lo = tl.load(rows_ptr + ro[:, None] + NOPE + 2 * rc[None, :], mask=rm[:, None], other=0).to(tl.int32)
        hi = tl.load(rows_ptr + ro[:, None] + NOPE + 2 * rc[None, :] + 1, mask=rm[:, None], other=0).to(tl.int32)
        f = ((hi << 24) | (lo << 16)).to(tl.float32, bitcast=True)  # bf16 bits in the top half of an fp32
        tl.store(out_ptr + oo[:, None] + NOPE + rc[None, :], f.to(out_ptr.dtype.element_ty), mask=rm[:, None])


def _pow2_or_fail(name: str, value: int) -> None:
    if next_pow2(value) != value:
        raise ValueError(f"the Triton codec needs a power-of-two {name}, got {value}")


def fp8_ds_mla_quantize(x: torch.Tensor, out: torch.Tensor | None = None, *,
                        layout: Fp8DsMlaLayout = DSV4_LAYOUT) -> torch.Tensor:
    """Encode rows ``x [N, nope + rope]`` (fp32/bf16) into ``out [N, row_bytes]`` uint8 (allocated if None).

    ``out`` may be a strided row view (inner dim contiguous); it is returned.
    """
    if out is None:
        out = torch.empty(x.shape[0], layout.row_bytes, dtype=torch.uint8, device=x.device)
    check_row_encode(x, out, layout)
    _pow2_or_fail("qblock", layout.qblock)
    _pow2_or_fail("rope", layout.rope)
    require_triton("fp8_ds_mla_quantize")
    if x.shape[0] == 0:
        return out
    pad = layout.row_bytes - layout.scale_off - layout.n_scales
    block_r = tiles_for(x.device).codec_rows
    _quant_kernel[(triton.cdiv(x.shape[0], block_r),)](
        x, out, x.shape[0], x.stride(0), out.stride(0), NOPE=layout.nope, ROPE=layout.rope, QBLOCK=layout.qblock,
        PAD=pad, PAD_P2=next_pow2(pad), BLOCK_R=block_r, X_IS_BF16=x.dtype == torch.bfloat16)
    return out


def fp8_ds_mla_dequantize(rows: torch.Tensor, *, out_dtype: torch.dtype = torch.bfloat16,
                          layout: Fp8DsMlaLayout = DSV4_LAYOUT) -> torch.Tensor:
    """Decode ``rows [N, row_bytes]`` uint8 into ``[N, nope + rope]`` of ``out_dtype``."""
    _check_dequant(rows, out_dtype, layout)
    _pow2_or_fail("qblock", layout.qblock)
    _pow2_or_fail("rope", layout.rope)
    require_triton("fp8_ds_mla_dequantize")
    out = torch.empty(rows.shape[0], layout.dim, dtype=out_dtype, device=rows.device)
    if rows.shape[0] == 0:
        return out
    block_r = tiles_for(rows.device).codec_rows
    _dequant_kernel[(triton.cdiv(rows.shape[0], block_r),)](
        rows, out, rows.shape[0], rows.stride(0), out.stride(0), NOPE=layout.nope, ROPE=layout.rope,
        QBLOCK=layout.qblock, BLOCK_R=block_r)
    return out
