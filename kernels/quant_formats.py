"""The quantized formats of the DeepSeek-V4 release, and what the kernels over them share.

* **e8m0** scale: one unsigned byte ``b``, value ``2^(b - 127)``; ``b = 255`` is NaN, there is no zero
  (``b = 0`` is ``2^-127``). Stored as ``torch.float8_e8m0fnu`` (a ``uint8`` view holds the same bits).
* **FP8 e4m3** weight ``[out, in]`` (``torch.float8_e4m3fn``) with one e8m0 scale per 128 x 128 block:
  ``scale [ceil(out/128), ceil(in/128)]``.
* **MXFP4** weight: e2m1 codes packed two per byte, ``[out, in/2]`` (``uint8``; the release stores the
  same bytes as ``int8``). Byte ``j`` of a row holds input ``2j`` in its low nibble and ``2j+1`` in its
  high nibble. A code is ``sign(1) | exponent(2) | mantissa(1)``: magnitudes ``0, 0.5, 1, 1.5, 2, 3, 4,
  6``. One e8m0 scale per 32 inputs: ``scale [out, in/32]``.

Weights are only decoded here (the GEMM references and kernels need it; encoding weights belongs to
the model side, :mod:`atom.models.deepseek_v4.quant`), and the two weight-only GEMMs share their
operand checks and launch (:func:`check_gemm_operands`, :func:`launch_weight_gemm`).

The FP8 KV row codecs (``fp8_ds_mla``, ``fp8_index_key``) share one power-of-two scale rule,
``e = ceil(log2(max(amax, 1e-4) / 448))`` computed from the fp32 bits (the exponent, plus one if the
mantissa is non-zero), in torch (:func:`pow2_scale_exponent`) and in Triton (``ue8m0_exponent``), so
both agree bit for bit; Triton encodes e4m3 in software (``e4m3_bits``: the interpreter's fp32->fp8
cast is wrong, triton_on_cpu.md 2.3-2.4).
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F

from ._common import HAS_TRITON, VALUE_DTYPES, check_rows, check_same_device, triton, tl
from .tiles import tiles_for

__all__ = ["FP8_BLOCK", "FP4_GROUP", "E2M1_VALUES", "e8m0_to_float", "unpack_fp4", "check_fp8_weight",
           "check_mxfp4_weight", "dequantize_fp8_rows", "dequantize_mxfp4_rows", "gemm_by_row_tiles",
           "gemm_tiles", "check_gemm_operands", "launch_weight_gemm", "FP8_MAX", "FP8_AMAX_FLOOR",
           "pow2_scale_exponent", "pow2_float", "check_row_encode", "fp8_roundtrip", "fp8_scale"]

FP8_BLOCK = 128
FP4_GROUP = 32
FP8_MAX = 448.0  # the largest finite e4m3 value
FP8_AMAX_FLOOR = 1e-4  # an all-zero block still gets a finite scale
#: e2m1 code (0..15) -> value; codes 8..15 are the negatives of 0..7 (code 8 is -0.0).
E2M1_VALUES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                            -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0])
_SCALE_DTYPES = (torch.float8_e8m0fnu, torch.uint8)


def e8m0_to_float(scale: torch.Tensor) -> torch.Tensor:
    """fp32 values of e8m0 scales given as ``float8_e8m0fnu`` or their ``uint8`` bits."""
    if scale.dtype == torch.uint8:
        scale = scale.view(torch.float8_e8m0fnu)
    if scale.dtype != torch.float8_e8m0fnu:
        raise ValueError(f"e8m0 scales must be float8_e8m0fnu or uint8, got {scale.dtype}")
    return scale.float()


def unpack_fp4(packed: torch.Tensor) -> torch.Tensor:
    """fp32 values ``[..., 2n]`` of packed e2m1 bytes ``[..., n]`` (low nibble first)."""
    b = packed.view(torch.uint8).long()
    table = E2M1_VALUES.to(packed.device)
    return torch.stack((table[b & 15], table[b >> 4]), dim=-1).flatten(-2)


def check_fp8_weight(name: str, weight: torch.Tensor, scale: torch.Tensor) -> None:
    """``weight [N, K]`` e4m3 with ``scale [ceil(N/128), ceil(K/128)]`` e8m0; ``ValueError`` otherwise."""
    if weight.dim() != 2 or weight.dtype != torch.float8_e4m3fn:
        raise ValueError(f"{name}: weight must be a 2-D float8_e4m3fn tensor, got {weight.dtype} "
                         f"{tuple(weight.shape)}")
    n, k = weight.shape
    expect = (math.ceil(n / FP8_BLOCK), math.ceil(k / FP8_BLOCK))
    if scale.dtype not in _SCALE_DTYPES or tuple(scale.shape) != expect:
        raise ValueError(f"{name}: scale must be e8m0 (float8_e8m0fnu or uint8) of shape {expect} for a "
                         f"{n}x{k} weight in {FP8_BLOCK}x{FP8_BLOCK} blocks, got {scale.dtype} "
                         f"{tuple(scale.shape)}")


def check_mxfp4_weight(name: str, weight: torch.Tensor, scale: torch.Tensor) -> None:
    """``weight [N, K/2]`` packed uint8 with ``scale [N, K/32]`` e8m0; ``ValueError`` otherwise."""
    if weight.dim() != 2 or weight.dtype != torch.uint8:
        raise ValueError(f"{name}: packed FP4 weight must be a 2-D uint8 tensor [out, in/2], got "
                         f"{weight.dtype} {tuple(weight.shape)}")
    n, half = weight.shape
    if (2 * half) % FP4_GROUP:
        raise ValueError(f"{name}: in_features {2 * half} must be a multiple of {FP4_GROUP}")
    expect = (n, 2 * half // FP4_GROUP)
    if scale.dtype not in _SCALE_DTYPES or tuple(scale.shape) != expect:
        raise ValueError(f"{name}: scale must be e8m0 (float8_e8m0fnu or uint8) of shape {expect} (one per "
                         f"{FP4_GROUP} inputs), got {scale.dtype} {tuple(scale.shape)}")


def dequantize_fp8_rows(weight: torch.Tensor, scale: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    """fp32 rows ``lo:hi`` of an e4m3 block-128 weight (``lo`` a multiple of 128)."""
    assert lo % FP8_BLOCK == 0, lo
    s = e8m0_to_float(scale[lo // FP8_BLOCK : math.ceil(hi / FP8_BLOCK)])
    s = s.repeat_interleave(FP8_BLOCK, 0)[: hi - lo].repeat_interleave(FP8_BLOCK, 1)[:, : weight.shape[1]]
    return weight[lo:hi].float() * s


def dequantize_mxfp4_rows(weight: torch.Tensor, scale: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    """fp32 rows ``lo:hi`` ``[hi - lo, K]`` of a packed MXFP4 weight."""
    s = e8m0_to_float(scale[lo:hi]).repeat_interleave(FP4_GROUP, 1)
    return unpack_fp4(weight[lo:hi]) * s



def gemm_by_row_tiles(x: torch.Tensor, n: int, rows: Callable[[int, int], torch.Tensor]) -> torch.Tensor:
    """``x W^T`` in ``x.dtype`` (fp32 accumulate) where ``rows(lo, hi)`` dequantizes weight rows ``lo:hi``:
    at most 128 rows of the weight exist in fp32 at any time."""
    xf = x.float()
    out = torch.empty(x.shape[0], n, dtype=torch.float32, device=x.device)
    for lo in range(0, n, FP8_BLOCK):
        hi = min(lo + FP8_BLOCK, n)
        out[:, lo:hi] = F.linear(xf, rows(lo, hi))
    return out.to(x.dtype)


def gemm_tiles(m: int, device: torch.device) -> tuple[int, int, int]:
    """``(BM, BN, BK)`` of the quantized GEMM kernels: small M tiles for decode-sized batches; ``BN`` and
    ``BK`` divide 128 (one FP8 scale per tile). The interpreter pays per program: fewer, wider tiles."""
    bm = 16 if m <= 16 else (32 if m <= 32 else 64)
    t = tiles_for(device)
    return bm, t.gemm_bn, t.gemm_bk


def check_gemm_operands(name: str, x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                        check_weight: Callable[[str, torch.Tensor, torch.Tensor], None], inputs_per_column: int,
                        weight_name: str = "the weight") -> None:
    """``ValueError`` unless ``x [M, K]`` is rows of a ``VALUE_DTYPES`` dtype, ``weight`` and ``scale`` pass
    ``check_weight`` (the format's own check), the weight takes ``K`` inputs (``inputs_per_column``
    per stored column: 2 for packed FP4) and all three sit on one device."""
    check_rows("x", x, dtypes=VALUE_DTYPES)
    check_weight(name, weight, scale)
    if x.shape[1] != inputs_per_column * weight.shape[1]:
        raise ValueError(f"x has {x.shape[1]} features, {weight_name} {inputs_per_column * weight.shape[1]}")
    check_same_device(x=x, weight=weight, scale=scale)


def launch_weight_gemm(kernel, x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``[M, N]`` in ``x.dtype`` from a weight-only GEMM kernel (checked operands) of the shared
    signature ``(x, w, s, y, M, N, K, stride_xm, stride_wn, stride_sn, stride_ym, BM, BN, BK, FP32, NATIVE)``,
    on the :func:`gemm_tiles` grid; scales are passed as their ``uint8`` bits."""
    m, k = x.shape
    n = weight.shape[0]
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0:
        return y
    bm, bn, bk = gemm_tiles(m, x.device)
    assert FP8_BLOCK % bn == 0 and FP8_BLOCK % bk == 0 and bk % FP4_GROUP == 0  # whole scale blocks per tile
    w = weight.contiguous()
    s = scale.contiguous().view(torch.uint8)
    grid = (triton.cdiv(m, bm), triton.cdiv(n, bn))
    kernel[grid](x, w, s, y, m, n, k, x.stride(0), w.stride(0), s.stride(0), y.stride(0),
                 BM=bm, BN=bn, BK=bk, FP32=x.dtype == torch.float32, NATIVE=tiles_for(x.device).native_bf16_dot)
    return y


def pow2_scale_exponent(amax: torch.Tensor) -> torch.Tensor:
    """``ceil(log2(max(amax, 1e-4) / 448))`` (int32) from the fp32 bits: ``2**e`` scales a block whose
    largest magnitude is ``amax`` into e4m3's range."""
    v = (amax.clamp(min=FP8_AMAX_FLOOR) / FP8_MAX).view(torch.int32)
    return ((v >> 23) & 0xFF) - 127 + ((v & 0x7FFFFF) != 0).to(torch.int32)


def pow2_float(e: torch.Tensor) -> torch.Tensor:
    """``2**e`` (fp32, exact) of int32 exponents in the normal range, built from the exponent bits."""
    return ((e + 127) << 23).to(torch.int32).view(torch.float32)


def fp8_roundtrip(x: torch.Tensor, block: int) -> torch.Tensor:
    """FP8-e4m3 quantize->dequantize over blocks of ``block`` values along the last dim (pow-2 scales)."""
    shape = x.shape
    xb = x.float().reshape(*shape[:-1], shape[-1] // block, block)
    scale = fp8_scale(xb.abs().amax(-1, keepdim=True))
    q = (xb / scale).to(torch.float8_e4m3fn).float()
    return (q * scale).reshape(shape).to(x.dtype)


def fp8_scale(amax: torch.Tensor) -> torch.Tensor:
    """The power-of-two FP8 scale of a block whose largest magnitude is ``amax`` (fp32, same shape): the rule of
    the arena's FP8 codecs (:func:`pow2_scale_exponent`), so stored rows decode to
    the round-trip's values bit for bit."""
    return pow2_float(pow2_scale_exponent(amax.float()))


def check_row_encode(x: torch.Tensor, out: torch.Tensor, layout) -> None:
    """``ValueError`` unless a row codec's encode gets ``x [N, layout.dim]`` rows of a ``VALUE_DTYPES`` dtype and
    ``out [N, layout.row_bytes]`` uint8 rows on the same device (and ``layout`` passes its check)."""
    layout.check()
    check_rows("x", x, dtypes=VALUE_DTYPES, width=layout.dim)
    check_rows("out", out, dtype=torch.uint8, width=layout.row_bytes)
    if out.shape[0] != x.shape[0]:
        raise ValueError(f"out has {out.shape[0]} rows, x has {x.shape[0]}")
    if out.device != x.device:
        raise ValueError(f"x is on {x.device}, out on {out.device}")


if HAS_TRITON:

    @triton.jit
    def e8m0_decode(b):
        """fp32 value of e8m0 bits ``b`` (uint8) built from the exponent bits (exact; no ``exp2``,
        which flushes ``2^-127`` to zero on GPUs)."""
        e = b.to(tl.int32)
        bits = tl.where(e == 0, 0x00400000, e << 23)
        bits = tl.where(e == 255, 0x7FC00000, bits)
        return bits.to(tl.float32, bitcast=True)

    @triton.jit
    def e2m1_decode(code):
        """fp32 value of 4-bit e2m1 codes (int32 in 0..15): ``m/2`` for exponent 0, else
        ``(1 + m/2) * 2^(e-1)``; bit 3 is the sign."""
        e = (code >> 1) & 3
        m = code & 1
        mag = tl.where(e == 0, m.to(tl.float32) * 0.5, ((2 + m) << e).to(tl.float32) * 0.25)
        return tl.where((code & 8) != 0, -mag, mag)

    @triton.jit
    def ue8m0_exponent(amax):
        """ceil(log2(max(amax, 1e-4) / 448)) from the fp32 bits (int32), as :func:`pow2_scale_exponent`."""
        v = (tl.maximum(amax, 1e-4) / 448.0).to(tl.int32, bitcast=True)
        return ((v >> 23) & 0xFF) - 127 + ((v & 0x7FFFFF) != 0).to(tl.int32)

    @triton.jit
    def e4m3_bits(x):
        """fp32 -> uint8 bits of float8_e4m3fn, RTNE, saturating at 448 (triton_on_cpu.md 2.4)."""
        u = x.to(tl.uint32, bitcast=True)
        sign = (u >> 31) & 1
        a = u & 0x7FFFFFFF
        r = a + 0x7FFFF + ((a >> 20) & 1)
        normal = tl.minimum((r >> 20).to(tl.int32) - (120 << 3), 0x7E)
        af = a.to(tl.float32, bitcast=True)
        sub = ((af * 512.0 + 8388608.0) - 8388608.0).to(tl.int32)
        mag = tl.where(a < 0x3C800000, sub, normal)
        mag = tl.where(a > 0x7F800000, 0x7F, mag)
        return (mag | (sign.to(tl.int32) << 7)).to(tl.uint8)
