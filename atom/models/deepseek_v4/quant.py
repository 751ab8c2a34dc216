"""The numerics of the release: simulated activation quantization and the FP8 / MXFP4 weight codecs.

Activation round-trips mirror the released model (dsv4_model.md section 2): the NoPE dims of every KV row and
compressed entry go through FP8-e4m3 with power-of-two (ue8m0) block scales and its RoPE dims through bf16 (the
release computes and caches them in bf16; ``kv_row_roundtrip``); indexer queries and keys go through a scaled
Walsh-Hadamard rotation and FP4-e2m1 with power-of-two block scales.  The FP8 scale follows the release's
activation quantizer exactly: ``2**ceil(log2(max(amax, 1e-4) / 448))``, the ceiling taken from the fp32 bits, so a
row stored by the arena's ``fp8_ds_mla`` codec decodes to the same values bit for bit.  They are applied before a
row is used or cached, so fresh and cached values are identical.  The official forward also quantizes the input of
every FP8 / FP4 GEMM to FP8-e4m3 in blocks of 128 with power-of-two scales
(``fp8_roundtrip(x, act_quant_block(K))``).  FP4 rounds half to even (0.75 -> 1, 1.75 -> 2, 3.5 -> 4).  All round
trips return new tensors of the input dtype.

Weights: FP8-e4m3 in 128 x 128 blocks with e8m0 scales, and MXFP4 (packed e2m1 pairs with one e8m0 scale per
32 inputs; layout in :mod:`atom.kernels.quant_formats`).  Encoders here write tiny checkpoints; the decoders are
used by references and tests (the model keeps its weights quantized).
"""

from __future__ import annotations

import functools
import math

import torch

from atom.kernels.quant_formats import (fp8_roundtrip, fp8_scale, E2M1_VALUES, FP4_GROUP, FP8_MAX, e8m0_to_float,
                                        unpack_fp4)

from .device_constants import on_device

FP4_MAX = 6.0


def _pow2_scale(amax: torch.Tensor, qmax: float) -> torch.Tensor:
    """Smallest power of two ``s`` with ``amax / s <= qmax`` (ue8m0); 1 for all-zero blocks."""
    ratio = (amax / qmax).clamp(min=2.0**-126)
    return torch.exp2(torch.ceil(torch.log2(ratio)))


# e2m1 rounding: a magnitude above boundary i moves to code i + 1; on a boundary it goes to the code with an
# even mantissa (round half to even), which is the upper code for the odd boundaries 0.75, 1.75 and 3.5.
_FP4_BOUNDS = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
_FP4_TIES_UP = torch.tensor([False, True, False, True, False, True, False])


def fp4_encode(v: torch.Tensor) -> torch.Tensor:
    """e2m1 codes (uint8 0..15: sign bit 3, magnitude code 0..7) of already-scaled values, round half to even.

    Magnitudes above 6 saturate to 6; ``-0.0`` and values that round to zero keep their sign bit."""
    a = v.float().abs()
    bounds, up = on_device(_FP4_BOUNDS, v.device), on_device(_FP4_TIES_UP, v.device)
    code = (a[..., None] > bounds).sum(-1) + ((a[..., None] == bounds) & up).sum(-1)
    return (code + 8 * torch.signbit(v.float()).long()).to(torch.uint8)


def fp4_decode(code: torch.Tensor) -> torch.Tensor:
    """fp32 values of e2m1 codes (uint8 0..15)."""
    return on_device(E2M1_VALUES, code.device)[code.long()]
def kv_row_roundtrip(x: torch.Tensor, nope: int, block: int) -> torch.Tensor:
    """A KV row as the release stores it: FP8 round-trip of the first ``nope`` dims, bf16 round-trip of the rest."""
    return torch.cat((fp8_roundtrip(x[..., :nope], block), x[..., nope:].to(torch.bfloat16).to(x.dtype)), dim=-1)


def fp4_roundtrip(x: torch.Tensor, block: int) -> torch.Tensor:
    """FP4-e2m1 quantize->dequantize (round half to even) over blocks along the last dim (pow-2 scales)."""
    shape = x.shape
    xb = x.float().reshape(*shape[:-1], shape[-1] // block, block)
    scale = _pow2_scale(xb.abs().amax(-1, keepdim=True), FP4_MAX)
    q = fp4_decode(fp4_encode(xb / scale))
    return (q * scale).reshape(shape).to(x.dtype)


def act_quant_block(in_features: int) -> int:
    """The activation block of the FP8 quantization in front of a quantized GEMM: 128 as released; for
    narrower test models, the largest power of two <= 128 dividing ``in_features``."""
    return math.gcd(in_features, 128)


def hadamard_matrix(n: int, device: torch.device | str | None = None) -> torch.Tensor:
    """``n^-1/2``-scaled Sylvester Walsh-Hadamard matrix (``n`` a power of two); orthogonal and symmetric."""
    if n & (n - 1):
        raise ValueError(f"hadamard size must be a power of two, got {n}")
    h = torch.ones(1, 1)
    while h.shape[0] < n:
        h = torch.cat((torch.cat((h, h), 1), torch.cat((h, -h), 1)), 0)
    return (h / math.sqrt(n)).to(device)


@functools.cache
def _host_hadamard(n: int, dtype: torch.dtype) -> torch.Tensor:
    """:func:`hadamard_matrix` on the host in ``dtype``, built once per size (then copied to a device once)."""
    return hadamard_matrix(n).to(dtype)


def hadamard_rotate(x: torch.Tensor) -> torch.Tensor:
    """Rotate the last dim of ``x`` by the scaled Walsh-Hadamard matrix."""
    return x @ on_device(_host_hadamard(x.shape[-1], x.dtype), x.device)


# ----- weights --------------------------------------------------------------------------------------------------
WEIGHT_BLOCK = 128


def dequantize_fp8_weight(weight: torch.Tensor, scale: torch.Tensor, block: int = WEIGHT_BLOCK) -> torch.Tensor:
    """fp32 ``weight * scale`` for an e4m3 ``[out, in]`` weight with ``[ceil(out/b), ceil(in/b)]`` block scales."""
    out_f, in_f = weight.shape
    expect = (math.ceil(out_f / block), math.ceil(in_f / block))
    if tuple(scale.shape) != expect:
        raise ValueError(f"fp8 scale shape {tuple(scale.shape)} does not match weight {tuple(weight.shape)} "
                         f"with block {block} (expected {expect})")
    s = _scale_values(scale).repeat_interleave(block, 0)[:out_f].repeat_interleave(block, 1)[:, :in_f]
    return weight.float() * s


def quantize_fp8_weight(weight: torch.Tensor, block: int = WEIGHT_BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """Block-128 e4m3 quantization with e8m0 (power-of-two) scales, as in the released checkpoints."""
    out_f, in_f = weight.shape
    rb, cb = math.ceil(out_f / block), math.ceil(in_f / block)
    padded = torch.zeros(rb * block, cb * block)
    padded[:out_f, :in_f] = weight.float()
    amax = padded.reshape(rb, block, cb, block).abs().amax(dim=(1, 3))
    scale = _pow2_scale(amax, FP8_MAX)
    s = scale.repeat_interleave(block, 0)[:out_f].repeat_interleave(block, 1)[:, :in_f]
    q = (weight.float() / s).to(torch.float8_e4m3fn)
    return q, scale.to(torch.float8_e8m0fnu)


def quantize_mxfp4_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """MXFP4 as in the release: ``(packed uint8 [out, in/2], e8m0 scales [out, in/32])``; the scale of each
    32 inputs is the smallest power of two that brings their amax to <= 6, codes round half to even."""
    out_f, in_f = weight.shape
    if in_f % FP4_GROUP:
        raise ValueError(f"MXFP4 needs in_features divisible by {FP4_GROUP}, got {in_f}")
    groups = weight.float().reshape(out_f, in_f // FP4_GROUP, FP4_GROUP)
    scale = _pow2_scale(groups.abs().amax(-1, keepdim=True), FP4_MAX)
    codes = fp4_encode(groups / scale).reshape(out_f, in_f // 2, 2)
    packed = codes[..., 0] | (codes[..., 1] << 4)
    return packed, scale[..., 0].to(torch.float8_e8m0fnu)


def dequantize_mxfp4_weight(packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """fp32 ``[out, in]`` of a packed MXFP4 weight (whole; for references and tests)."""
    if packed.dim() != 2 or tuple(scale.shape) != (packed.shape[0], 2 * packed.shape[1] // FP4_GROUP):
        raise ValueError(f"MXFP4 scale shape {tuple(scale.shape)} does not match packed weight "
                         f"{tuple(packed.shape)} (expected [out, in/{FP4_GROUP}])")
    return unpack_fp4(packed) * _scale_values(scale).repeat_interleave(FP4_GROUP, 1)


def _scale_values(scale: torch.Tensor) -> torch.Tensor:
    """fp32 values of weight scales stored as e8m0 (or its uint8 bits) or as plain floats."""
    return e8m0_to_float(scale) if scale.dtype in (torch.float8_e8m0fnu, torch.uint8) else scale.float()
