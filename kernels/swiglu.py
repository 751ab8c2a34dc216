"""The experts' clamped SwiGLU as one op: ``silu(min(gate, limit)) * clamp(up, -limit, limit)`` in fp32.

Contract: ``gate`` and ``up [..., I]`` (the ``w1`` and ``w3`` outputs; same shape, fp32 / bf16 / fp16, inner dim
contiguous), ``limit`` a float (``<= 0``: no clamp), ``out_dtype`` -> a new ``[..., I]`` tensor of
``out_dtype``: both inputs are read as fp32, clamped as the reference ``Expert`` clamps them (``up`` both
ways, ``gate`` from above), multiplied in fp32 and cast once. :func:`swiglu_ref` is the reference's torch
arithmetic (two casts, two clamps, ``silu``, a multiply and a cast); :func:`swiglu` one Triton launch.
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
    def _swiglu_kernel(g_ptr, u_ptr, out_ptr, n, limit, CLAMP: tl.constexpr, BLOCK: tl.constexpr):
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        ok = offs < n
        g = tl.load(g_ptr + offs, mask=ok, other=0.0).to(tl.float32)
        u = tl.load(u_ptr + offs, mask=ok, other=0.0).to(tl.float32)
        if CLAMP:
            u = tl.minimum(tl.maximum(u, -limit), limit)
            g = tl.minimum(g, limit)
        h = g / (1.0 + tl.exp(-g)) * u
        tl.store(out_ptr + offs, rounded_for(h, out_ptr.dtype.element_ty), mask=ok)


def swiglu(gate: torch.Tensor, up: torch.Tensor, limit: float, out_dtype: torch.dtype) -> torch.Tensor:
    """The clamped SwiGLU of ``gate`` and ``up`` (see the module docstring); one launch."""
    _check(gate, up, limit, out_dtype)
    require_triton("swiglu")
    if gate.device != up.device:
        raise ValueError(f"gate is on {gate.device}, up on {up.device}; they must share a device")
    g, u = gate.contiguous(), up.contiguous()
    out = torch.empty(g.shape, dtype=out_dtype, device=g.device)
    n = g.numel()
    if n:
        block = min(1024, next_pow2(n))
        _swiglu_kernel[(triton.cdiv(n, block),)](g, u, out, n, float(limit), CLAMP=limit > 0, BLOCK=block)
    return out
