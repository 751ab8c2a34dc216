"""The FP8 lightning-indexer key codec: one key row into ``dim`` e4m3 bytes plus one fp32 scale, and back.

Row layout (real DSV4: ``index_head_dim`` 128 -> 132 bytes)::

    [0, dim)         fp8 e4m3fn values, value / 2**e
    [dim, dim + 4)   the scale 2**e as a little-endian fp32

One scale per key, a power of two: ``e = ceil(log2(max(amax, 1e-4) / 448))`` over the whole row,
computed from the fp32 bits by the rule the ``fp8_ds_mla`` codec uses (:mod:`~atom.kernels.quant_formats`;
torch and Triton agree bit for bit). fp8 encoding is round-to-nearest-even, saturating at 448. A power-of-two scale keeps keys
that already went through the indexer's FP4 round-trip (two significant bits, block scales that
are powers of two) exact, unless a block sits more than 2**16 below the row's largest value.
Dequantized values ``fp8 * 2**e`` are exact in fp32.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ._common import HAS_TRITON, check_positive, check_rows, next_pow2, require_triton, triton, tl
from .tiles import tiles_for
from .quant_formats import check_row_encode, pow2_float, pow2_scale_exponent

__all__ = ["Fp8IndexKeyLayout", "DSV4_INDEX_LAYOUT", "fp8_index_key_quantize", "fp8_index_key_quantize_ref",
           "fp8_index_key_dequantize", "fp8_index_key_dequantize_ref"]


class Fp8IndexKeyLayout(NamedTuple):
    """Geometry of one key row: ``dim`` fp8 values, then the fp32 scale."""

    dim: int = 128

    @property
    def row_bytes(self) -> int:
        return self.dim + 4

    def check(self) -> None:
        check_positive("dim", self.dim)
        if self.dim % 4:
            raise ValueError(f"dim={self.dim} must be a multiple of 4 (the fp32 scale follows the values)")


DSV4_INDEX_LAYOUT = Fp8IndexKeyLayout()
assert DSV4_INDEX_LAYOUT.row_bytes == 132


def _check_dequant(rows, layout) -> None:
    layout.check()
    check_rows("rows", rows, dtype=torch.uint8, width=layout.row_bytes)


def fp8_index_key_quantize_ref(x: torch.Tensor, out: torch.Tensor | None = None, *,
                               layout: Fp8IndexKeyLayout = DSV4_INDEX_LAYOUT) -> torch.Tensor:
    """Torch reference of :func:`fp8_index_key_quantize` (same contract)."""
    if out is None:
        out = torch.empty(x.shape[0], layout.row_bytes, dtype=torch.uint8, device=x.device)
    check_row_encode(x, out, layout)
    xf = x.float()
    e = pow2_scale_exponent(xf.abs().amax(dim=-1))
    out[:, :layout.dim] = (xf * pow2_float(-e)[:, None]).to(torch.float8_e4m3fn).view(torch.uint8)
    out[:, layout.dim:] = pow2_float(e)[:, None].contiguous().view(torch.uint8)
    return out


def fp8_index_key_dequantize_ref(rows: torch.Tensor, *, layout: Fp8IndexKeyLayout = DSV4_INDEX_LAYOUT
                                 ) -> torch.Tensor:
    """Torch reference of :func:`fp8_index_key_dequantize` (same contract)."""
    _check_dequant(rows, layout)
    q = rows[:, :layout.dim].contiguous().view(torch.float8_e4m3fn).float()
    scale = rows[:, layout.dim:].contiguous().view(torch.float32)
    return q * scale


if HAS_TRITON:
    from .quant_formats import e4m3_bits, ue8m0_exponent

    @triton.jit
    def store_index_key_rows(x_ptr, xo, out_ptr, oo, rm, DIM: tl.constexpr, BLOCK_D: tl.constexpr):
        """Encode the rows at ``x_ptr + xo[i]`` into the byte rows at ``out_ptr + oo[i]`` (rows with rm)."""
        d = tl.arange(0, BLOCK_D)
        m = rm[:, None] & (d[None, :] < DIM)
        x = tl.load(x_ptr + xo[:, None] + d[None, :], mask=m, other=0.0).to(tl.float32)
        e = ue8m0_exponent(tl.max(tl.abs(x), axis=1))
        inv = ((127 - e) << 23).to(tl.float32, bitcast=True)
        tl.store(out_ptr + oo[:, None] + d[None, :], e4m3_bits(x * inv[:, None]), mask=m)
        s = ((e + 127) << 23)  # the fp32 bits of 2**e, stored little endian
        for i in tl.static_range(4):
            tl.store(out_ptr + oo + DIM + i, ((s >> (8 * i)) & 0xFF).to(tl.uint8), mask=rm)

    @triton.jit
    def load_index_key_tile(rows_ptr, ro, valid, d, DIM: tl.constexpr):
        """fp32 ``[len(ro), len(d)]``: dims ``d`` of the key rows at ``rows_ptr + ro[i]``, decoded in registers.

        Rows without ``valid`` and dims ``d >= DIM`` read as 0."""
        s = tl.zeros(ro.shape, dtype=tl.int32)
        for i in tl.static_range(4):
            s = s | (tl.load(rows_ptr + ro + DIM + i, mask=valid, other=0).to(tl.int32) << (8 * i))
        m = valid[:, None] & (d[None, :] < DIM)
        q = tl.load(rows_ptr + ro[:, None] + d[None, :], mask=m, other=0)
        return q.to(tl.float8e4nv, bitcast=True).to(tl.float32) * s.to(tl.float32, bitcast=True)[:, None]

    @triton.jit
    def _quant_kernel(x_ptr, out_ptr, n, x_stride, out_stride, DIM: tl.constexpr, BLOCK_R: tl.constexpr,
                      BLOCK_D: tl.constexpr):
        r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        store_index_key_rows(x_ptr, r.to(tl.int64) * x_stride, out_ptr, r.to(tl.int64) * out_stride, r < n,
                             DIM, BLOCK_D)

    @triton.jit
    def _dequant_kernel(rows_ptr, out_ptr, n, rows_stride, out_stride, DIM: tl.constexpr, BLOCK_R: tl.constexpr,
                        BLOCK_D: tl.constexpr):
        r = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
        d = tl.arange(0, BLOCK_D)
        x = load_index_key_tile(rows_ptr, r.to(tl.int64) * rows_stride, r < n, d, DIM)
        tl.store(out_ptr + r.to(tl.int64)[:, None] * out_stride + d[None, :], x,
                 mask=(r < n)[:, None] & (d[None, :] < DIM))


def fp8_index_key_quantize(x: torch.Tensor, out: torch.Tensor | None = None, *,
                           layout: Fp8IndexKeyLayout = DSV4_INDEX_LAYOUT) -> torch.Tensor:
    """Encode keys ``x [N, dim]`` (fp32/bf16) into ``out [N, dim + 4]`` uint8 (allocated if None); returns out.

    ``out`` may be a strided row view (inner dim contiguous).
    """
    if out is None:
        out = torch.empty(x.shape[0], layout.row_bytes, dtype=torch.uint8, device=x.device)
    check_row_encode(x, out, layout)
    require_triton("fp8_index_key_quantize")
    if x.shape[0] == 0:
        return out
    block_r = tiles_for(x.device).codec_rows
    _quant_kernel[(triton.cdiv(x.shape[0], block_r),)](x, out, x.shape[0], x.stride(0), out.stride(0),
                                                       DIM=layout.dim, BLOCK_R=block_r, BLOCK_D=next_pow2(layout.dim))
    return out


def fp8_index_key_dequantize(rows: torch.Tensor, *, layout: Fp8IndexKeyLayout = DSV4_INDEX_LAYOUT) -> torch.Tensor:
    """Decode key rows ``[N, dim + 4]`` uint8 into fp32 ``[N, dim]``."""
    _check_dequant(rows, layout)
    require_triton("fp8_index_key_dequantize")
    out = torch.empty(rows.shape[0], layout.dim, dtype=torch.float32, device=rows.device)
    if rows.shape[0] == 0:
        return out
    block_r = tiles_for(rows.device).codec_rows
    _dequant_kernel[(triton.cdiv(rows.shape[0], block_r),)](rows, out, rows.shape[0], rows.stride(0), out.stride(0),
                                                            DIM=layout.dim, BLOCK_R=block_r,
                                                            BLOCK_D=next_pow2(layout.dim))
    return out
