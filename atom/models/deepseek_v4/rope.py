"""Interleaved (GPT-J pair) rotary embedding with optional YaRN frequency interpolation.

One frequency table per layer serves everything in it: queries, window KV rows, compressed entries, indexer q/k and
the inverse rotation of the attention output.  Ratio-0 layers use ``rope_theta`` without YaRN; compressed layers use
``compress_rope_theta`` with YaRN (when ``original_seq_len > 0``).  No YaRN magnitude scaling is applied.

Rotation acts on the *last* ``rope_dim`` dims of a vector: pairs ``(x[2k], x[2k+1])`` rotate by ``pos * freq[k]``.
Angles are computed elementwise from explicit positions, so the result for a position does not depend on which
other positions share the call.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TYPE_CHECKING, Iterator

import torch

from .config import DeepseekV4Config
from .device_constants import on_device

if TYPE_CHECKING:
    from atom.kernels.backend import KernelSet


def _correction_dim(num_rotations: float, dim: int, base: float, max_seq_len: int) -> float:
    return dim * math.log(max_seq_len / (num_rotations * 2 * math.pi)) / (2 * math.log(base))


def rope_frequencies(dim: int, base: float, original_seq_len: int = 0, factor: float = 1.0,
                     beta_fast: float = 32.0, beta_slow: float = 1.0) -> torch.Tensor:
    """fp32 ``[dim // 2]`` inverse frequencies; YaRN-interpolated when ``original_seq_len > 0``."""
    freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    if original_seq_len > 0:
        low = max(math.floor(_correction_dim(beta_fast, dim, base, original_seq_len)), 0)
        high = min(math.ceil(_correction_dim(beta_slow, dim, base, original_seq_len)), dim - 1)
        if low == high:
            high += 0.001
        ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
        smooth = 1 - ramp
        freqs = freqs / factor * (1 - smooth) + freqs * smooth
    return freqs


def layer_frequencies(cfg: DeepseekV4Config, ratio: int) -> torch.Tensor:
    """The frequency table of a layer with compression ``ratio`` (0: theta 10000, no YaRN)."""
    if ratio == 0:
        return rope_frequencies(cfg.rope_head_dim, cfg.rope_theta)
    return rope_frequencies(cfg.rope_head_dim, cfg.compress_rope_theta, cfg.original_seq_len, cfg.rope_factor,
                            cfg.beta_fast, cfg.beta_slow)


_SHARED_TABLES: ContextVar[dict | None] = ContextVar("atom_rope_tables", default=None)


@contextmanager
def shared_rope_tables() -> Iterator[None]:
    """Inside this scope :func:`apply_rope` computes the rotation tables of a ``(positions, freqs)`` pair
    (the same tensor objects) once: a layer rotates its queries, KV rows, indexer queries and output
    with the same positions. The tables are kept until the scope ends; tensors must not be changed in
    place inside it (the paged forward's step tensors are not)."""
    token = _SHARED_TABLES.set({})
    try:
        yield
    finally:
        _SHARED_TABLES.reset(token)


def rope_tables(positions: torch.Tensor, freqs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 ``(cos2, sin2)`` ``[T, 2 * len(freqs)]``: ``cos2 = (c_0, c_0, c_1, c_1, ...)``, ``sin2 = (-s_0, s_0,
    -s_1, s_1, ...)`` with ``c_k, s_k`` the cosine and sine of ``positions * freqs[k]``."""
    shared = _SHARED_TABLES.get()
    key = (id(positions), id(freqs))
    if shared is not None and key in shared:
        return shared[key][2]
    angles = positions.to(torch.float32)[:, None] * on_device(freqs, positions.device)[None, :]
    cos, sin = torch.cos(angles), torch.sin(angles)
    tables = torch.stack((cos, cos), dim=-1).flatten(-2), torch.stack((-sin, sin), dim=-1).flatten(-2)
    if shared is not None:
        shared[key] = (positions, freqs, tables)  # holding the keys' tensors keeps their ids unique
    return tables


def apply_rope(x: torch.Tensor, positions: torch.Tensor, freqs: torch.Tensor, inverse: bool = False, *,
               kernels: KernelSet | None = None) -> torch.Tensor:
    """Rotate the last ``2 * len(freqs)`` dims of ``x`` (``[T, ..., D]``) by ``positions`` (``[T]``).

    Returns a new tensor; the other dims are copied unchanged.  ``inverse`` rotates by ``-pos``.  Each pair
    is ``(e c - o s, o c + e s)``, computed as ``x * cos2 + swap(x) * sin2`` (``swap`` exchanges the two
    members of each pair; ``e c + o (-s)`` rounds exactly like ``e c - o s``).  ``kernels``: the caller's bound
    kernel set (:attr:`~.fused_ops.SmallOpsUser.small_ops`), whose ``rope`` kernel then rotates in one launch;
    None: the torch arithmetic above.
    """
    if kernels is not None:  # a GPU backend's fused kernel (see fused_ops.py)
        return kernels.rope(x, positions, on_device(freqs, positions.device), inverse)
    rd = 2 * freqs.shape[0]
    cos2, sin2 = rope_tables(positions, freqs)
    if inverse:
        sin2 = -sin2
    shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (rd,)
    cos2, sin2 = cos2.reshape(shape), sin2.reshape(shape)
    tail = x[..., -rd:].float()
    swapped = tail.unflatten(-1, (rd // 2, 2)).flip(-1).flatten(-2)
    rot = tail * cos2 + swapped * sin2
    return torch.cat((x[..., :-rd], rot.to(x.dtype)), dim=-1)


def normed_rope(x: torch.Tensor, weight: torch.Tensor | None, eps: float, positions: torch.Tensor,
                freqs: torch.Tensor, *, kernels: KernelSet | None = None) -> torch.Tensor:
    """:func:`apply_rope` of ``x`` RMS-normalised over its last dim (times ``weight`` when given) and rounded to
    ``x``'s dtype: the arithmetic of ``RMSNorm`` (``rms_normalize(x.float(), eps).to(x.dtype)`` without weight)
    followed by the rotation, op for op. With ``kernels`` (the caller's bound kernel set) one ``rms_norm_rope``
    launch, which reads a strided ``x`` in place."""
    if kernels is not None:
        return kernels.rms_norm_rope(x, weight, eps, positions, on_device(freqs, positions.device))
    y = x.float()
    y = y * torch.rsqrt(y.square().mean(-1, keepdim=True) + eps)
    if weight is not None:
        y = y * weight.float()
    return apply_rope(y.to(x.dtype), positions, freqs)
