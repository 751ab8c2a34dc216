"""Small building blocks shared by every DeepSeek-V4 module: Linear, RMSNorm, Embedding.

Parameters are created with ``torch.empty`` (no initialisation), so a model can be built on the ``meta`` device
without allocating memory; weights come from a checkpoint or from ``checkpoint.random_state_dict``.

Batch invariance: ``map_rows(fn, True, ...)`` applies a token-local function to one token at a time, so every
GEMM becomes a GEMV and every elementwise kernel (whose SIMD / scalar-tail split depends on the tensor size) sees
the same shape whether a token is computed alone (decode) or among many (prefill).  The model routes all
token-local work through it when ``cfg.batch_invariant`` is set.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn


def map_rows(fn: Callable[..., Any], row_wise: bool, *args: torch.Tensor | None) -> Any:
    """``fn(*args)``; with ``row_wise``, ``fn`` runs on each leading row ``[i:i+1]`` of every tensor argument and
    the outputs (a tensor, ``None`` or a tuple / NamedTuple of them) are concatenated along dim 0."""
    if not row_wise:
        return fn(*args)
    n = next(a.shape[0] for a in args if a is not None)
    return _concat([fn(*(None if a is None else a[i : i + 1] for a in args)) for i in range(n)])


def _concat(outs: list[Any]) -> Any:
    first = outs[0]
    if first is None:
        return None
    if isinstance(first, tuple):
        parts = [_concat([o[k] for o in outs]) for k in range(len(first))]
        return type(first)(*parts) if hasattr(first, "_fields") else tuple(parts)
    return torch.cat(outs, 0)


class Linear(nn.Module):
    """A bias-free linear layer ``y = x W^T`` with ``weight: [out_features, in_features]``.

    ``dtype`` fixes the parameter dtype; the input is cast to it (the compressor runs its projections in fp32).
    """

    def __init__(self, in_features: int, out_features: int, *,
                 dtype: torch.dtype | None = None, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=dtype, device=device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x.to(self.weight.dtype), self.weight)


class RMSNorm(nn.Module):
    """Weighted RMSNorm over the last dim, computed in fp32: ``x * rsqrt(mean(x^2) + eps) * weight``."""

    def __init__(self, dim: int, eps: float, *, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim, dtype=dtype, device=device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + self.eps)
        return (x * self.weight.float()).to(dtype)


def rms_normalize(x: torch.Tensor, eps: float) -> torch.Tensor:
    """RMS normalisation without weight over the last dim (per-head query norm, mHC input norm)."""
    return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps)


class Embedding(nn.Module):
    """Token embedding table ``weight: [vocab_size, dim]``."""

    def __init__(self, vocab_size: int, dim: int, *, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, dim, dtype=dtype, device=device))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight)
