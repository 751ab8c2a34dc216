"""FP8 activations for the W8A8 GEMM: the release's activation quantizer as one launch, alone or fused after RMSNorm.

Contract (each Triton wrapper and its ``_ref`` share it):

* ``fp8_act_quant(x, block) -> (xq, xs)``: ``x [M, K]`` fp32 / bf16 (inner dim contiguous), ``block`` a power of
  two in 16..128 dividing ``K``. ``xq [M, K]`` ``float8_e4m3fn`` and ``xs [M, K / block]`` fp32: each block of
  ``block`` consecutive values of a row shares the power-of-two scale ``2**ceil(log2(max(amax, 1e-4) / 448))``
  (:func:`atom.kernels.quant_formats.fp8_scale`), and ``xq = x / xs`` rounded to nearest even. So
  ``xq.float() * xs`` (each scale repeated over its block) is :func:`~atom.kernels.quant_formats.fp8_roundtrip`
  ``(x, block)`` bit for bit: the input the reference model's quantized linears multiply with ``quant_sim`` on.
* ``rms_norm_fp8(x, weight, eps, block) -> (y, xq, xs)``: ``y = rms_norm(x, weight, eps)`` (the contract of
  :mod:`atom.kernels.rms_norm`, ``x [M, D]``) and ``fp8_act_quant(y, block)`` of that ``y`` (after its rounding to
  ``x.dtype``, as the linear that takes it would quantize it), in one launch: each program holds a tile of whole
  rows in registers, normalises them, stores ``y`` and quantizes the rounded values.

Scales are fp32 (the values ``2**e``), not e8m0 bytes: the GEMMs that take them (ours and aiter's
``gemm_a8w8_blockscale``) read fp32 activation scales. The scale division is ``div_rn`` (IEEE rounding on a GPU,
where ``/`` may be approximate), the value scaling a multiply by the exact ``2**-e`` built from bits, and the e4m3
encoding is done in software (the interpreter's fp32 -> fp8 cast is wrong), so the kernels give the reference's
bytes on every target.
"""

from __future__ import annotations

import torch

from ._common import HAS_TRITON, check_rows, next_pow2, require_triton, triton, tl
from .quant_formats import FP8_BLOCK, fp8_scale
from .rms_norm import _check as check_norm, rms_norm_ref
from .store_rounding import elements_per_program, rounded_for

if HAS_TRITON:
    from .quant_formats import e4m3_bits

__all__ = ["fp8_act_quant", "fp8_act_quant_ref", "rms_norm_fp8", "rms_norm_fp8_ref", "dequantize_act",
           "check_act_block"]

_DTYPES = (torch.float32, torch.bfloat16)
MIN_ACT_BLOCK = 16  # the smallest K step of an fp8 tensor-core dot


def check_act_block(block: int, width: int) -> None:
    """``ValueError`` unless ``block`` is a power of two in 16..128 dividing ``width``."""
    if not isinstance(block, int) or block < MIN_ACT_BLOCK or block > FP8_BLOCK or block & (block - 1) \
            or width % block:
        raise ValueError(f"block must be a power of two in {MIN_ACT_BLOCK}..{FP8_BLOCK} dividing the row width "
                         f"{width}, got {block!r}")


def _check_x(x: torch.Tensor) -> None:
    check_rows("x", x, dtypes=_DTYPES)


def fp8_act_quant_ref(x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Torch reference of :func:`fp8_act_quant` (same contract): ``fp8_roundtrip``'s arithmetic, kept quantized."""
    _check_x(x)
    check_act_block(block, x.shape[1])
    m, k = x.shape
    xb = x.float().reshape(m, k // block, block)
    scale = fp8_scale(xb.abs().amax(-1, keepdim=True))
    return (xb / scale).to(torch.float8_e4m3fn).reshape(m, k), scale[..., 0]


def dequantize_act(xq: torch.Tensor, xs: torch.Tensor) -> torch.Tensor:
    """fp32 ``xq * xs`` with each scale repeated over its block (``K / xs.shape[1]`` values)."""
    block = xq.shape[1] // xs.shape[1]
    return (xq.float().reshape(xq.shape[0], xs.shape[1], block) * xs[..., None]).reshape(xq.shape)


def rms_norm_fp8_ref(x: torch.Tensor, weight: torch.Tensor | None, eps: float, block: int
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Torch reference of :func:`rms_norm_fp8`: :func:`rms_norm_ref` then :func:`fp8_act_quant_ref` of its output."""
    _check_x(x)
    y = rms_norm_ref(x, weight, eps)
    return (y, *fp8_act_quant_ref(y, block))


if HAS_TRITON:

    @triton.jit
    def _quantize_tile(v, BLOCK_R: tl.constexpr, BLOCK: tl.constexpr, AB: tl.constexpr):
        """fp32 rows ``v [BLOCK_R, BLOCK]`` -> (e4m3 bits ``[BLOCK_R, BLOCK]``, fp32 scales ``[BLOCK_R, BLOCK / AB]``),
        one power-of-two scale per ``AB`` columns (padding columns must hold 0)."""
        vb = tl.reshape(v, (BLOCK_R, BLOCK // AB, AB))
        amax = tl.max(tl.abs(vb), axis=2)
        r = tl.math.div_rn(tl.maximum(amax, 1e-4), 448.0).to(tl.int32, bitcast=True)
        e = ((r >> 23) & 0xFF) - 127 + ((r & 0x7FFFFF) != 0).to(tl.int32)
        scale = ((e + 127) << 23).to(tl.float32, bitcast=True)
        inv = ((127 - e) << 23).to(tl.float32, bitcast=True)
        q = e4m3_bits(vb * inv[:, :, None])
        return tl.reshape(q, (BLOCK_R, BLOCK)), scale

    @triton.jit
    def _store_quantized(v, row, col, rows, width, q_ptr, s_ptr, BLOCK_R: tl.constexpr, BLOCK: tl.constexpr,
                         AB: tl.constexpr):
        q, scale = _quantize_tile(v, BLOCK_R, BLOCK, AB)
        ok = (row < rows)[:, None] & (col < width)[None, :]
        tl.store(q_ptr + row[:, None] * width + col[None, :], q, mask=ok)
        g = tl.arange(0, BLOCK // AB)
        groups = width // AB
        tl.store(s_ptr + row[:, None] * groups + g[None, :], scale, mask=(row < rows)[:, None] & (g < groups)[None, :])

    @triton.jit
    def _act_quant_kernel(x_ptr, q_ptr, s_ptr, rows, width, stride_x, BLOCK_R: tl.constexpr, BLOCK: tl.constexpr,
                          AB: tl.constexpr):
        row = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
        col = tl.arange(0, BLOCK)
        ok = (row < rows)[:, None] & (col < width)[None, :]
        v = tl.load(x_ptr + row[:, None] * stride_x + col[None, :], mask=ok, other=0.0).to(tl.float32)
        _store_quantized(v, row, col, rows, width, q_ptr, s_ptr, BLOCK_R, BLOCK, AB)

    @triton.jit
    def _rms_norm_fp8_kernel(x_ptr, w_ptr, y_ptr, q_ptr, s_ptr, rows, width, stride_x, eps, HAS_WEIGHT: tl.constexpr,
                             BLOCK_R: tl.constexpr, BLOCK: tl.constexpr, AB: tl.constexpr):
        row = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
        col = tl.arange(0, BLOCK)
        ok = (row < rows)[:, None] & (col < width)[None, :]
        x = tl.load(x_ptr + row[:, None] * stride_x + col[None, :], mask=ok, other=0.0).to(tl.float32)
        inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / width + eps)
        y = x * inv[:, None]
        if HAS_WEIGHT:
            y = y * tl.load(w_ptr + col, mask=col < width, other=0.0).to(tl.float32)[None, :]
        yr = rounded_for(y, y_ptr.dtype.element_ty)
        tl.store(y_ptr + row[:, None] * width + col[None, :], yr, mask=ok)
        _store_quantized(tl.where(ok, yr.to(tl.float32), 0.0), row, col, rows, width, q_ptr, s_ptr, BLOCK_R, BLOCK,
                         AB)


def _outputs(x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    m, k = x.shape
    return (torch.empty(m, k, dtype=torch.float8_e4m3fn, device=x.device),
            torch.empty(m, k // block, dtype=torch.float32, device=x.device))


def _rows_per_program(x: torch.Tensor, block: int) -> int:
    return max(1, min(next_pow2(x.shape[0]), elements_per_program(x.device) // block))


def fp8_act_quant(x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 activations and their scales in one launch (see the module docstring)."""
    _check_x(x)
    check_act_block(block, x.shape[1])
    require_triton("fp8_act_quant")
    xq, xs = _outputs(x, block)
    rows, width = x.shape
    if rows:
        tile = next_pow2(width)
        br = _rows_per_program(x, tile)
        _act_quant_kernel[(triton.cdiv(rows, br),)](x, xq.view(torch.uint8), xs, rows, width, x.stride(0),
                                                    BLOCK_R=br, BLOCK=tile, AB=block)
    return xq, xs


def rms_norm_fp8(x: torch.Tensor, weight: torch.Tensor | None, eps: float, block: int
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """RMSNorm of every row of ``x [M, D]`` and the FP8 activations of the result, in one launch (module
    docstring)."""
    _check_x(x)
    check_norm(x, weight, eps)
    check_act_block(block, x.shape[1])
    require_triton("rms_norm_fp8")
    if weight is not None and weight.device != x.device:
        raise ValueError(f"weight is on {weight.device}, x on {x.device}; they must share a device")
    rows, width = x.shape
    y = torch.empty(rows, width, dtype=x.dtype, device=x.device)
    xq, xs = _outputs(x, block)
    if rows:
        tile = next_pow2(width)
        br = _rows_per_program(x, tile)
        w = x if weight is None else weight.contiguous()  # an unused pointer when there is no weight
        _rms_norm_fp8_kernel[(triton.cdiv(rows, br),)](x, w, y, xq.view(torch.uint8), xs, rows, width, x.stride(0),
                                                       eps, HAS_WEIGHT=weight is not None, BLOCK_R=br, BLOCK=tile,
                                                       AB=block)
    return y, xq, xs
