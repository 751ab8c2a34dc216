"""The experts' clamped SwiGLU as one op: ``silu(min(gate, limit)) * clamp(up, -limit, limit)`` in fp32.

Contract: ``gate`` and ``up [..., I]`` (the ``w1`` and ``w3`` outputs; same shape, fp32 / bf16 / fp16), ``limit``
a float (``<= 0``: no clamp), ``out_dtype`` -> a new contiguous ``[..., I]`` tensor of ``out_dtype``: both inputs
are read as fp32, clamped as the reference ``Expert`` clamps them (``up`` both ways, ``gate`` from above),
multiplied in fp32 and cast once. :func:`swiglu_ref` is the reference's torch
arithmetic (two casts, two clamps, ``silu``, a multiply and a cast); :func:`swiglu` one Triton launch.

The kernel reads rows with their own strides (only the inner dim must be contiguous), so ``gate`` and ``up`` can
be the two column halves of one merged ``w1`` / ``w3`` product (``MergedLinear``) with no copy; other layouts
are copied contiguous first. One program per (row, block of ``I``).
``silu`` is ``g * sigmoid(g)``; the kernel's ``exp`` may differ from torch's in the last bit of fp32.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._common import HAS_TRITON, next_pow2, require_triton, triton, tl
from .store_rounding import rounded_for

__all__ = ["swiglu", "swiglu_ref"]

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _check(gate: torch.Tensor, up: torch.Tensor, limit: float, out_dtype: torch.dtype) -> None:
    for name, t in (("gate", gate), ("up", up)):
        if not isinstance(t, torch.Tensor) or t.dim() < 1 or t.dtype not in _DTYPES:
            raise ValueError(f"{name} must be a tensor [..., I] of dtype {', '.join(map(str, _DTYPES))}, got "
                             f"{getattr(t, 'dtype', type(t).__name__)}")
    if gate.shape != up.shape:
        raise ValueError(f"gate {tuple(gate.shape)} and up {tuple(up.shape)} must have the same shape")
    if not isinstance(limit, (int, float)):
        raise ValueError(f"limit must be a float (<= 0: no clamp), got {limit!r}")
    if out_dtype not in _DTYPES:
        raise ValueError(f"out_dtype must be one of {', '.join(map(str, _DTYPES))}, got {out_dtype}")


def swiglu_ref(gate: torch.Tensor, up: torch.Tensor, limit: float, out_dtype: torch.dtype) -> torch.Tensor:
    """Torch reference of :func:`swiglu` (same contract): the reference ``Expert``'s arithmetic."""
    _check(gate, up, limit, out_dtype)
    g, u = gate.float(), up.float()
    if limit > 0:
        u = u.clamp(-limit, limit)
        g = g.clamp(max=limit)
    return (F.silu(g) * u).to(out_dtype)


if HAS_TRITON:

    @triton.jit
    def _swiglu_kernel(g_ptr, u_ptr, out_ptr, width, stride_g, stride_u, limit, CLAMP: tl.constexpr,
                       BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        ok = cols < width
        g = tl.load(g_ptr + row * stride_g + cols, mask=ok, other=0.0).to(tl.float32)
        u = tl.load(u_ptr + row * stride_u + cols, mask=ok, other=0.0).to(tl.float32)
        if CLAMP:
            u = tl.minimum(tl.maximum(u, -limit), limit)
            g = tl.minimum(g, limit)
        h = g / (1.0 + tl.exp(-g)) * u
        tl.store(out_ptr + row * width + cols, rounded_for(h, out_ptr.dtype.element_ty), mask=ok)


def swiglu(gate: torch.Tensor, up: torch.Tensor, limit: float, out_dtype: torch.dtype) -> torch.Tensor:
    """The clamped SwiGLU of ``gate`` and ``up`` (see the module docstring); one launch."""
    _check(gate, up, limit, out_dtype)
    require_triton("swiglu")
    if gate.device != up.device:
        raise ValueError(f"gate is on {gate.device}, up on {up.device}; they must share a device")
    out = torch.empty(gate.shape, dtype=out_dtype, device=gate.device)
    width = gate.shape[-1]
    if out.numel():
        g, u = _rows(gate), _rows(up)
        block = min(1024, next_pow2(width))
        _swiglu_kernel[(g.shape[0], triton.cdiv(width, block))](
            g, u, out, width, g.stride(0), u.stride(0), float(limit), CLAMP=limit > 0, BLOCK=block)
    return out


def _rows(t: torch.Tensor) -> torch.Tensor:
    """``t`` as ``[rows, I]`` with a unit inner stride: a view when its layout allows (a column slice of a wider
    product does), else a contiguous copy."""
    rows = t.reshape(-1, t.shape[-1])
    return rows if rows.stride(-1) == 1 or rows.shape[-1] == 1 else rows.contiguous()
