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

import torch

from .config import DeepseekV4Config


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


def apply_rope(x: torch.Tensor, positions: torch.Tensor, freqs: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    """Rotate the last ``2 * len(freqs)`` dims of ``x`` (``[T, ..., D]``) by ``positions`` (``[T]``).

    Returns a new tensor; the other dims are copied unchanged.  ``inverse`` rotates by ``-pos``.
    """
    rd = 2 * freqs.shape[0]
    angles = positions.to(torch.float32)[:, None] * freqs.to(positions.device)[None, :]
    cos, sin = torch.cos(angles), torch.sin(angles)
    if inverse:
        sin = -sin
    shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (rd // 2,)
    cos, sin = cos.reshape(shape), sin.reshape(shape)
    tail = x[..., -rd:].float()
    even, odd = tail[..., 0::2], tail[..., 1::2]
    rot = torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)
    return torch.cat((x[..., :-rd], rot.to(x.dtype)), dim=-1)
