"""aiter (ROCm) implementations of the quantized-weight GEMM ops, registered by :mod:`.backend` when aiter imports.

``fp8_block_gemm_aiter`` has the contract of :func:`atom.kernels.fp8_gemm.fp8_block_gemm_ref` and runs aiter's
``gemm_a16w8_blockscale`` (16-bit activations, FP8 weight, fp32 scales per 128 x 128 block). MI300-class GPUs
(gfx94x) multiply ``float8_e4m3fnuz``, whose exponent bias is one higher than ``e4m3fn``'s: the same byte means
half the value, and ``0x80`` (``-0`` in e4m3fn) is NaN. :func:`to_e4m3fnuz` rewrites the weight once (``0x80``
-> ``0x00``, scales x 2) and the result is kept per weight tensor. No aiter kernel matches ``mxfp4_gemm``'s
packed layout, so that op runs its Triton wrapper under the aiter backend.

``w8a8_block_gemm_aiter`` has the contract of :func:`atom.kernels.w8a8_gemm.w8a8_block_gemm_ref` and runs aiter's
Triton ``gemm_a8w8_blockscale(x, w, x_scale, w_scale, dtype)``: ``x`` = ``xq`` ``[M, K]`` fp8, ``w`` = the weight
``[N, K]`` fp8, ``x_scale`` = ``xs`` ``[M, K / 128]`` fp32, ``w_scale`` = the weight's e8m0 scales as fp32
``[ceil(N/128), ceil(K/128)]``, ``dtype`` = ``out_dtype``. aiter infers its scale blocks from these shapes
(``K / scale_k``), so it takes only 128-wide activation blocks (the release's); narrower ones (test models) run
the Triton wrapper. On gfx94x both operands are rewritten to ``e4m3fnuz`` as above (the activations every call:
``0x80`` -> ``0``, scales x 2). Neither aiter GEMM has been run here: this project has no ROCm machine, and
``import aiter`` fails on a CPU.
"""

from __future__ import annotations

import importlib
from typing import Any, Callable

import torch

from .fp8_gemm import _check
from .quant_formats import FP8_BLOCK, e8m0_to_float
from .w8a8_gemm import _check as check_w8a8, w8a8_block_gemm

__all__ = ["to_e4m3fnuz", "fp8_block_gemm_aiter", "w8a8_block_gemm_aiter", "aiter_implementations"]

_MODULES = ("aiter.ops.triton.gemm.basic.gemm_a16w8_blockscale", "aiter.ops.triton.gemm_a16w8_blockscale")
_A8W8_MODULES = ("aiter.ops.triton.gemm.basic.gemm_a8w8_blockscale", "aiter.ops.triton.gemm_a8w8_blockscale")
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


def _aiter_op(modules: tuple[str, ...], op: str) -> Callable[..., torch.Tensor]:
    for name in modules:
        try:
            return getattr(importlib.import_module(name), op)
        except (ImportError, AttributeError):
            continue
    raise ImportError(f"aiter has no {op} in {', '.join(modules)}")


def _aiter_a16w8() -> Callable[..., torch.Tensor]:
    return _aiter_op(_MODULES, "gemm_a16w8_blockscale")


def fp8_block_gemm_aiter(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """aiter block-scaled FP8 GEMM (contract of :func:`atom.kernels.fp8_gemm.fp8_block_gemm_ref`; 16-bit
    inputs: fp32 ``x`` is multiplied as bf16 and returned as fp32)."""
    _check(x, weight, scale)
    w, s = _device_weight(weight, scale)
    x16 = x if x.dtype == torch.bfloat16 else x.to(torch.bfloat16)
    return _aiter_a16w8()(x16, w, s, torch.bfloat16).to(x.dtype)


def w8a8_block_gemm_aiter(xq: torch.Tensor, xs: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                          out_dtype: torch.dtype) -> torch.Tensor:
    """aiter W8A8 block-scaled GEMM (contract of :func:`atom.kernels.w8a8_gemm.w8a8_block_gemm_ref`; the module
    docstring gives the argument mapping). Activation blocks narrower than 128 run the Triton wrapper."""
    if check_w8a8(xq, xs, weight, scale, out_dtype) != FP8_BLOCK:
        return w8a8_block_gemm(xq, xs, weight, scale, out_dtype)
    w, s = _device_weight(weight, scale)
    if _needs_fnuz(xq.device):
        bits = xq.view(torch.uint8)
        xq, xs = torch.where(bits == 0x80, 0, bits).view(torch.float8_e4m3fnuz), xs * 2.0
    return _aiter_op(_A8W8_MODULES, "gemm_a8w8_blockscale")(xq, w, xs, s, out_dtype)


def aiter_implementations() -> dict[str, Any]:
    """The ops aiter implements (the registry calls this only where ``import aiter`` works)."""
    return {"fp8_block_gemm": fp8_block_gemm_aiter, "w8a8_block_gemm": w8a8_block_gemm_aiter}
