"""Interleaved (GPT-J pair) rotary embedding as one op: the reference model's ``apply_rope``.

Contract: ``x [T, ..., D]`` (fp32 / bf16 / fp16, inner dim contiguous), ``positions [T]`` (int32 / int64),
``freqs [R / 2]`` fp32 (the layer's inverse frequencies), ``inverse`` -> a new tensor of ``x``'s shape and dtype
whose last ``R`` dims are rotated pair by pair, ``(e, o) -> (e c - o s, o c + e s)`` with ``c, s`` the cosine and
sine of ``position * freq`` (``-position`` when ``inverse``), computed in fp32 and cast once; the other dims
are copied. :func:`rope_ref` is the reference's torch arithmetic (the angle tables, a slice, a pair swap, two
multiplies, an add and a concatenation); :func:`rope` is one Triton launch, each program a tile of
(token, head) rows, computing the angles in registers. ``cos`` / ``sin`` may differ from torch's in the last bit
of fp32.
"""

from __future__ import annotations

import torch

from ._common import HAS_TRITON, next_pow2, require_triton, triton, tl
from .store_rounding import elements_per_program, rounded_for

__all__ = ["rope", "rope_ref"]

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
    def _rope_kernel(x_ptr, pos_ptr, freq_ptr, out_ptr, rows, heads, width, rope_dim, sign,
                     BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
        r = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)  # rows of [T * heads, width]
        col = tl.arange(0, BLOCK_D)
        first = width - rope_dim
        rel = tl.maximum(col - first, 0)
        odd = rel % 2
        rotated = (col >= first) & (col < width)
        live = r < rows
        ok = live[:, None] & (col[None, :] < width)
        base = r[:, None] * width
        x = tl.load(x_ptr + base + col[None, :], mask=ok, other=0.0).to(tl.float32)
        partner = tl.where(rotated, col + 1 - 2 * odd, col)
        xp = tl.load(x_ptr + base + partner[None, :], mask=ok, other=0.0).to(tl.float32)
        pos = tl.load(pos_ptr + r // heads, mask=live, other=0).to(tl.float32)
        freq = tl.load(freq_ptr + rel // 2, mask=rotated, other=0.0)
        rot = rotate_pairs(x, xp, pos, freq, odd, sign)
        y = tl.where(rotated[None, :], rot, x)
        tl.store(out_ptr + base + col[None, :], rounded_for(y, out_ptr.dtype.element_ty), mask=ok)


def rope(x: torch.Tensor, positions: torch.Tensor, freqs: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    """``x`` with its last ``2 * len(freqs)`` dims rotated (see the module docstring); one launch."""
    _check(x, positions, freqs)
    require_triton("rope")
    if len({x.device, positions.device, freqs.device}) != 1:
        raise ValueError("x, positions and freqs must share a device")
    xc = x.contiguous()
    out = torch.empty_like(xc)
    t, width = xc.shape[0], xc.shape[-1]
    heads = xc.numel() // max(t * width, 1)
    if xc.numel():
        rows = t * heads
        block_d = next_pow2(width)
        block_r = max(1, min(next_pow2(rows), elements_per_program(xc.device) // block_d))
        _rope_kernel[(triton.cdiv(rows, block_r),)](xc, positions.contiguous(), freqs.contiguous(), out, rows, heads,
                                                    width, 2 * freqs.shape[0], -1.0 if inverse else 1.0,
                                                    BLOCK_R=block_r, BLOCK_D=block_d)
    return out
