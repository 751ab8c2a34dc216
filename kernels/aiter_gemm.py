"""aiter (ROCm) implementations of the quantized-weight GEMM ops, registered by :mod:`.backend` when aiter imports.

``fp8_block_gemm_aiter`` has the contract of :func:`atom.kernels.fp8_gemm.fp8_block_gemm_ref` and runs aiter's
``gemm_a16w8_blockscale`` (16-bit activations, FP8 weight, fp32 scales per 128 x 128 block). MI300-class GPUs
(gfx94x) multiply ``float8_e4m3fnuz``, whose exponent bias is one higher than ``e4m3fn``'s: the same byte means
half the value, and ``0x80`` (``-0`` in e4m3fn) is NaN. :func:`to_e4m3fnuz` rewrites the weight once (``0x80``
-> ``0x00``, scales x 2) and the result is kept per weight tensor. No aiter kernel matches ``mxfp4_gemm``'s
packed layout, so that op runs its Triton wrapper under the aiter backend.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

import torch

from .fp8_gemm import _check
from .quant_formats import e8m0_to_float

__all__ = ["to_e4m3fnuz", "fp8_block_gemm_aiter", "aiter_implementations"]

_MODULES = ("aiter.ops.triton.gemm.basic.gemm_a16w8_blockscale", "aiter.ops.triton.gemm_a16w8_blockscale")
_FNUZ_CACHE: dict[tuple[int, torch.device], tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}


def to_e4m3fnuz(weight: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(float8_e4m3fnuz weight, fp32 scale)`` with the values of an e4m3fn weight and its e8m0 scales."""
    bits = weight.view(torch.uint8).clone()
    bits[bits == 0x80] = 0
    return bits.view(torch.float8_e4m3fnuz), e8m0_to_float(scale) * 2.0


def _needs_fnuz(device: torch.device) -> bool:
    return device.type == "cuda" and "gfx94" in getattr(torch.cuda.get_device_properties(device), "gcnArchName", "")


def _device_weight(weight: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    if not _needs_fnuz(weight.device):
        return weight, e8m0_to_float(scale)
    key = (weight.data_ptr(), weight.device)
    hit = _FNUZ_CACHE.get(key)
    if hit is None or hit[0] is not weight:
        hit = (weight, *to_e4m3fnuz(weight, scale))
        _FNUZ_CACHE[key] = hit
    return hit[1], hit[2]


def _aiter_a16w8() -> Callable[..., torch.Tensor]:
    for name in _MODULES:
        try:
            return importlib.import_module(name).gemm_a16w8_blockscale
        except (ImportError, AttributeError):
            continue
    raise ImportError(f"aiter has no gemm_a16w8_blockscale in {', '.join(_MODULES)}")


def fp8_block_gemm_aiter(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """aiter block-scaled FP8 GEMM (contract of :func:`atom.kernels.fp8_gemm.fp8_block_gemm_ref`; 16-bit
    inputs: fp32 ``x`` is multiplied as bf16 and returned as fp32)."""
    _check(x, weight, scale)
    w, s = _device_weight(weight, scale)
    x16 = x if x.dtype == torch.bfloat16 else x.to(torch.bfloat16)
    return _aiter_a16w8()(x16, w, s, torch.bfloat16).to(x.dtype)


def aiter_implementations() -> dict[str, Any]:
    """The ops aiter implements (the registry calls this only where ``import aiter`` works)."""
    return {"fp8_block_gemm": fp8_block_gemm_aiter}
