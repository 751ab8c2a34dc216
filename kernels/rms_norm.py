"""RMSNorm over the last dim as one op: ``y = (x * rsqrt(mean(x^2) + eps) * weight)`` in fp32, cast to ``x``'s dtype.

Contract: ``x [..., D]`` (fp32 / bf16 / fp16, inner dim contiguous; rows may be strided, e.g. a column slice of a
merged GEMM's output, and are read in place), ``weight [D]`` or None (the per-head query
norm and mHC's input norm carry no weight), ``eps`` a float >= 0 -> a new tensor of ``x``'s shape and dtype.
The reference model's ``RMSNorm`` (weight) and ``rms_normalize(x.float(), eps).to(x.dtype)`` (no weight) are
this contract; :func:`rms_norm_ref` is that arithmetic in torch. The torch version is about eight ops
(cast, square, mean, add, rsqrt, two multiplies, cast); :func:`rms_norm` is one Triton launch, each program a
tile of whole rows in registers. The sum of squares is reduced in a tree inside the program, torch's mean in its own
order, so the two agree to the last bit or two of fp32 (the kernel tests bound it).
"""

from __future__ import annotations

import torch

from ._common import HAS_TRITON, next_pow2, require_triton, triton, tl
from .store_rounding import elements_per_program, rounded_for

__all__ = ["rms_norm", "rms_norm_ref"]

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _check(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() < 1 or x.dtype not in _DTYPES:
        raise ValueError(f"x must be a tensor [..., D] of dtype {', '.join(map(str, _DTYPES))}, got "
                         f"{getattr(x, 'dtype', type(x).__name__)} {tuple(getattr(x, 'shape', ()))}")
    if x.shape[-1] < 1:
        raise ValueError(f"x must have a non-empty last dim, got shape {tuple(x.shape)}")
    if weight is not None and (not isinstance(weight, torch.Tensor) or weight.shape != (x.shape[-1],)
                               or weight.dtype not in _DTYPES):
        raise ValueError(f"weight must be None or a [{x.shape[-1]}] fp32/bf16/fp16 tensor, got "
                         f"{getattr(weight, 'dtype', type(weight).__name__)} {tuple(getattr(weight, 'shape', ()))}")
    if not isinstance(eps, float) or not eps >= 0:
        raise ValueError(f"eps must be a float >= 0, got {eps!r}")


def rms_norm_ref(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """Torch reference of :func:`rms_norm` (same contract): the reference model's ``RMSNorm`` arithmetic."""
    _check(x, weight, eps)
    y = x.float()
    y = y * torch.rsqrt(y.square().mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.float()
    return y.to(x.dtype)


if HAS_TRITON:

    @triton.jit
    def _rms_norm_kernel(x_ptr, w_ptr, out_ptr, rows, width, stride_x, eps, HAS_WEIGHT: tl.constexpr,
                         BLOCK_R: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
        col = tl.arange(0, BLOCK)
        ok = (row < rows)[:, None] & (col < width)[None, :]
        offs = row[:, None] * width + col[None, :]
        x = tl.load(x_ptr + row[:, None] * stride_x + col[None, :], mask=ok, other=0.0).to(tl.float32)
        inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / width + eps)
        y = x * inv[:, None]
        if HAS_WEIGHT:
            y = y * tl.load(w_ptr + col, mask=col < width, other=0.0).to(tl.float32)[None, :]
        tl.store(out_ptr + offs, rounded_for(y, out_ptr.dtype.element_ty), mask=ok)


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """RMSNorm of every row of ``x`` (see the module docstring); one launch for all rows."""
    _check(x, weight, eps)
    require_triton("rms_norm")
    width = x.shape[-1]
    if weight is not None and weight.device != x.device:
        raise ValueError(f"weight is on {weight.device}, x on {x.device}; they must share a device")
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    rows = out.numel() // width
    if rows:
        x2 = x.reshape(rows, width)  # a view of strided rows where one exists
        if x2.stride(1) != 1:
            x2 = x2.contiguous()
        w = x2 if weight is None else weight.contiguous()  # an unused pointer when there is no weight
        block = next_pow2(width)
        block_r = max(1, min(next_pow2(rows), elements_per_program(x.device) // block))
        _rms_norm_kernel[(triton.cdiv(rows, block_r),)](x2, w, out, rows, width, x2.stride(0), eps,
                                                         HAS_WEIGHT=weight is not None, BLOCK_R=block_r, BLOCK=block)
    return out
