"""Simulated quantization (activation round-trips) and FP8 weight dequantization.

Activation round-trips mirror the released model (dsv4_model.md section 2): the NoPE dims of every KV row and
compressed entry go through FP8-e4m3 with power-of-two (ue8m0) block scales; indexer queries and keys go through a
scaled Walsh-Hadamard rotation and FP4-e2m1 with power-of-two block scales.  They are applied before a row is used
or cached, so fresh and cached values are identical.  All functions return new tensors of the input dtype.
"""

from __future__ import annotations

import math

import torch

FP8_MAX = 448.0
FP4_MAX = 6.0
_FP4_GRID = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])


def _pow2_scale(amax: torch.Tensor, qmax: float) -> torch.Tensor:
    """Smallest power of two ``s`` with ``amax / s <= qmax`` (ue8m0); 1 for all-zero blocks."""
    ratio = (amax / qmax).clamp(min=2.0**-126)
    return torch.exp2(torch.ceil(torch.log2(ratio)))


def fp8_roundtrip(x: torch.Tensor, block: int) -> torch.Tensor:
    """FP8-e4m3 quantize->dequantize over blocks of ``block`` values along the last dim (pow-2 scales)."""
    shape = x.shape
    xb = x.float().reshape(*shape[:-1], shape[-1] // block, block)
    scale = _pow2_scale(xb.abs().amax(-1, keepdim=True), FP8_MAX)
    q = (xb / scale).to(torch.float8_e4m3fn).float()
    return (q * scale).reshape(shape).to(x.dtype)


def fp4_roundtrip(x: torch.Tensor, block: int) -> torch.Tensor:
    """FP4-e2m1 quantize->dequantize (round to nearest grid value) over blocks along the last dim."""
    shape = x.shape
    xb = x.float().reshape(*shape[:-1], shape[-1] // block, block)
    scale = _pow2_scale(xb.abs().amax(-1, keepdim=True), FP4_MAX)
    v = (xb / scale).clamp(-FP4_MAX, FP4_MAX)
    grid = _FP4_GRID.to(x.device)
    idx = (v.abs()[..., None] - grid).abs().argmin(-1)
    q = grid[idx] * torch.sign(v)
    return (q * scale).reshape(shape).to(x.dtype)


def hadamard_matrix(n: int, device: torch.device | str | None = None) -> torch.Tensor:
    """``n^-1/2``-scaled Sylvester Walsh-Hadamard matrix (``n`` a power of two); orthogonal and symmetric."""
    if n & (n - 1):
        raise ValueError(f"hadamard size must be a power of two, got {n}")
    h = torch.ones(1, 1)
    while h.shape[0] < n:
        h = torch.cat((torch.cat((h, h), 1), torch.cat((h, -h), 1)), 0)
    return (h / math.sqrt(n)).to(device)


def hadamard_rotate(x: torch.Tensor) -> torch.Tensor:
    """Rotate the last dim of ``x`` by the scaled Walsh-Hadamard matrix."""
    h = hadamard_matrix(x.shape[-1], x.device).to(x.dtype)
    return x @ h


# ----- weights --------------------------------------------------------------------------------------------------
WEIGHT_BLOCK = 128


def dequantize_fp8_weight(weight: torch.Tensor, scale: torch.Tensor, block: int = WEIGHT_BLOCK) -> torch.Tensor:
    """fp32 ``weight * scale`` for an e4m3 ``[out, in]`` weight with ``[ceil(out/b), ceil(in/b)]`` block scales."""
    out_f, in_f = weight.shape
    expect = (math.ceil(out_f / block), math.ceil(in_f / block))
    if tuple(scale.shape) != expect:
        raise ValueError(f"fp8 scale shape {tuple(scale.shape)} does not match weight {tuple(weight.shape)} "
                         f"with block {block} (expected {expect})")
    s = scale.float().repeat_interleave(block, 0)[:out_f].repeat_interleave(block, 1)[:, :in_f]
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
