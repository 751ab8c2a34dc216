"""Interleaved (GPT-J pair) rotary embedding as one op: the reference model's ``apply_rope``.

Contract: ``x [T, ..., D]`` (fp32 / bf16 / fp16, inner dim contiguous), ``positions [T]`` (int32 / int64),
``freqs [R / 2]`` fp32 (the layer's inverse frequencies), ``inverse`` -> a new tensor of ``x``'s shape and dtype
whose last ``R`` dims are rotated pair by pair, ``(e, o) -> (e c - o s, o c + e s)`` with ``c, s`` the cosine and
sine of ``position * freq`` (``-position`` when ``inverse``), computed in fp32 and cast once; the other dims
are copied. :func:`rope_ref` is the reference's torch arithmetic (the angle tables, a slice, a pair swap, two
multiplies, an add and a concatenation); :func:`rope` is one Triton launch, each program a tile of
(token, head) rows, computing the angles in registers. ``cos`` / ``sin`` may differ from torch's in the last bit
of fp32.

``rms_norm_rope(x, weight, eps, positions, freqs)`` is ``rope(rms_norm(x, weight, eps), positions, freqs)`` (the
contract of :mod:`.rms_norm`, the norm over each row's last dim, rounded to ``x``'s dtype before the rotation)
in one launch: the attention's per-head query norm and RoPE, a compressed entry's norm and RoPE. Its ``x`` may
be a strided view (any token and head strides, inner dim contiguous: a column slice of a merged GEMM's
output); the result is a new contiguous tensor. Each program holds whole rows, so the norm's sum of squares is
the ``rms_norm`` kernel's reduction and the rotation the ``rope`` kernel's: on one device it gives their bits.
"""

from __future__ import annotations

import torch

from ._common import HAS_TRITON, next_pow2, require_triton, triton, tl
from .rms_norm import _check as check_norm, rms_norm_ref
from .store_rounding import elements_per_program, rounded_for

__all__ = ["rope", "rope_ref", "rms_norm_rope", "rms_norm_rope_ref"]

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _check(x: torch.Tensor, positions: torch.Tensor, freqs: torch.Tensor) -> None:
    if not isinstance(x, torch.Tensor) or x.dim() < 2 or x.dtype not in _DTYPES:
        raise ValueError(f"x must be a [T, ..., D] fp32/bf16/fp16 tensor, got "
                         f"{getattr(x, 'dtype', type(x).__name__)} {tuple(getattr(x, 'shape', ()))}")
    if (not isinstance(positions, torch.Tensor) or positions.shape != (x.shape[0],)
            or positions.dtype not in (torch.int32, torch.int64)):
        raise ValueError(f"positions must be an int32/int64 tensor of shape ({x.shape[0]},), got "
                         f"{getattr(positions, 'dtype', type(positions).__name__)} "
                         f"{tuple(getattr(positions, 'shape', ()))}")
    if not isinstance(freqs, torch.Tensor) or freqs.dim() != 1 or freqs.dtype != torch.float32:
        raise ValueError(f"freqs must be a 1-d fp32 tensor, got {getattr(freqs, 'dtype', type(freqs).__name__)}")
    if not 0 < 2 * freqs.shape[0] <= x.shape[-1]:
        raise ValueError(f"2 * len(freqs) = {2 * freqs.shape[0]} must be in 1..{x.shape[-1]} (the last dim of x)")


def rope_ref(x: torch.Tensor, positions: torch.Tensor, freqs: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    """Torch reference of :func:`rope` (same contract)."""
    _check(x, positions, freqs)
    rd = 2 * freqs.shape[0]
    angles = positions.to(torch.float32)[:, None] * freqs.to(positions.device)[None, :]
    cos, sin = torch.cos(angles), torch.sin(angles)
    cos2 = torch.stack((cos, cos), dim=-1).flatten(-2)
    sin2 = torch.stack((-sin, sin), dim=-1).flatten(-2)
    if inverse:
        sin2 = -sin2
    shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (rd,)
    tail = x[..., -rd:].float()
    swapped = tail.unflatten(-1, (rd // 2, 2)).flip(-1).flatten(-2)
    rot = tail * cos2.reshape(shape) + swapped * sin2.reshape(shape)
    return torch.cat((x[..., :-rd], rot.to(x.dtype)), dim=-1)


def rms_norm_rope_ref(x: torch.Tensor, weight: torch.Tensor | None, eps: float, positions: torch.Tensor,
                      freqs: torch.Tensor) -> torch.Tensor:
    """Torch reference of :func:`rms_norm_rope` (module docstring): ``rms_norm_ref`` then ``rope_ref``."""
    _check(x, positions, freqs)
    return rope_ref(rms_norm_ref(x, weight, eps), positions, freqs)


if HAS_TRITON:

    @triton.jit
    def rotate_pairs(x, xp, pos, freq, odd, sign):
        """fp32 ``[rows, cols]``: ``x`` rotated with its pair partners ``xp`` by the angle ``pos * freq`` (times
        ``sign``); ``odd`` says which member of its pair each column is. The arithmetic of every kernel that
        rotates (``rope``, ``rope_kv_write``), written once so that they compile to the same instructions."""
        angle = pos[:, None] * freq[None, :]
        c = tl.cos(angle)
        s = tl.sin(angle) * sign
        s = tl.where((odd == 1)[None, :], s, -s)
        return x * c + xp * s

    @triton.jit
    def _normed(v, inv, w_ptr, col, width, HAS_WEIGHT: tl.constexpr, dt: tl.constexpr):
        """fp32 ``v * inv`` (times ``weight[col]``) rounded to ``dt`` as the norm stores it, back in fp32."""
        y = v * inv[:, None]
        if HAS_WEIGHT:
            y = y * tl.load(w_ptr + col, mask=col < width, other=0.0).to(tl.float32)[None, :]
        return rounded_for(y, dt).to(tl.float32)

    @triton.jit
    def _rope_kernel(x_ptr, pos_ptr, freq_ptr, out_ptr, w_ptr, rows, heads, width, rope_dim, sign, stride_t,
                     stride_h, eps, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr, NORM: tl.constexpr,
                     HAS_WEIGHT: tl.constexpr):
        r = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)  # rows of [T * heads, width]
        col = tl.arange(0, BLOCK_D)
        first = width - rope_dim
        rel = tl.maximum(col - first, 0)
        odd = rel % 2
        rotated = (col >= first) & (col < width)
        live = r < rows
        ok = live[:, None] & (col[None, :] < width)
        src = (r // heads) * stride_t + (r % heads) * stride_h
        x = tl.load(x_ptr + src[:, None] + col[None, :], mask=ok, other=0.0).to(tl.float32)
        partner = tl.where(rotated, col + 1 - 2 * odd, col)
        xp = tl.load(x_ptr + src[:, None] + partner[None, :], mask=ok, other=0.0).to(tl.float32)
        if NORM:  # the rms_norm kernel's arithmetic, its output rounded to x's dtype before the rotation
            inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / width + eps)
            x = _normed(x, inv, w_ptr, col, width, HAS_WEIGHT, out_ptr.dtype.element_ty)
            xp = _normed(xp, inv, w_ptr, partner, width, HAS_WEIGHT, out_ptr.dtype.element_ty)
        pos = tl.load(pos_ptr + r // heads, mask=live, other=0).to(tl.float32)
        freq = tl.load(freq_ptr + rel // 2, mask=rotated, other=0.0)
        rot = rotate_pairs(x, xp, pos, freq, odd, sign)
        y = tl.where(rotated[None, :], rot, x)
        tl.store(out_ptr + r[:, None] * width + col[None, :], rounded_for(y, out_ptr.dtype.element_ty), mask=ok)


def _launch(x: torch.Tensor, positions: torch.Tensor, freqs: torch.Tensor, sign: float,
            norm: tuple[torch.Tensor | None, float] | None) -> torch.Tensor:
    """One ``_rope_kernel`` launch over ``x [T, ..., D]`` viewed as ``[T, heads, D]`` (strided when it can be)."""
    if len({x.device, positions.device, freqs.device}) != 1:
        raise ValueError("x, positions and freqs must share a device")
    t, width = x.shape[0], x.shape[-1]
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if not out.numel():
        return out
    x3 = x.reshape(t, -1, width)
    if x3.stride(-1) != 1:
        x3 = x3.contiguous()
    heads, rows = x3.shape[1], t * x3.shape[1]
    weight, eps = norm if norm is not None else (None, 0.0)
    block_d = next_pow2(width)
    block_r = max(1, min(next_pow2(rows), elements_per_program(x.device) // block_d))
    w = x3 if weight is None else weight.contiguous()  # an unused pointer when there is no weight
    _rope_kernel[(triton.cdiv(rows, block_r),)](x3, positions.contiguous(), freqs.contiguous(), out, w, rows, heads,
                                                width, 2 * freqs.shape[0], sign, x3.stride(0), x3.stride(1), eps,
                                                BLOCK_R=block_r, BLOCK_D=block_d, NORM=norm is not None,
                                                HAS_WEIGHT=weight is not None)
    return out


def rope(x: torch.Tensor, positions: torch.Tensor, freqs: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    """``x`` with its last ``2 * len(freqs)`` dims rotated (see the module docstring); one launch."""
    _check(x, positions, freqs)
    require_triton("rope")
    return _launch(x, positions, freqs, -1.0 if inverse else 1.0, None)


def rms_norm_rope(x: torch.Tensor, weight: torch.Tensor | None, eps: float, positions: torch.Tensor,
                  freqs: torch.Tensor) -> torch.Tensor:
    """``rope(rms_norm(x, weight, eps), positions, freqs)`` in one launch (module docstring)."""
    _check(x, positions, freqs)
    check_norm(x, weight, eps)
    require_triton("rms_norm_rope")
    if weight is not None and weight.device != x.device:
        raise ValueError(f"weight is on {weight.device}, x on {x.device}; they must share a device")
    return _launch(x, positions, freqs, 1.0, (weight, eps))
