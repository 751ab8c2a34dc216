"""Small building blocks shared by every DeepSeek-V4 module: Linear, RMSNorm, Embedding.

Parameters are created with ``torch.empty`` (no initialisation), so a model can be built on the ``meta`` device
without allocating memory; weights come from a checkpoint or from ``checkpoint.random_state_dict``.

Batch invariance: ``Linear(..., row_wise=True)`` computes each row of its input with its own GEMV, so a token's
output is bit-identical whether it is computed alone (decode) or among many tokens (prefill).  Every other op in
the model is either elementwise or a reduction over the last dim of one row, which is batch-invariant on CPU.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def linear(x: torch.Tensor, weight: torch.Tensor, row_wise: bool) -> torch.Tensor:
    """``x @ weight.T`` over the last dim of ``x``; with ``row_wise`` each leading row is its own GEMV."""
    if not row_wise or x.numel() == 0:
        return F.linear(x, weight)
    flat = x.reshape(-1, x.shape[-1])
    out = torch.cat([F.linear(flat[i : i + 1], weight) for i in range(flat.shape[0])], dim=0)
    return out.reshape(*x.shape[:-1], weight.shape[0])


class Linear(nn.Module):
    """A bias-free linear layer ``y = x W^T`` with ``weight: [out_features, in_features]``.

    ``dtype`` fixes the parameter dtype; the input is cast to it (the compressor runs its projections in fp32).
    """

    def __init__(self, in_features: int, out_features: int, *, row_wise: bool = False,
                 dtype: torch.dtype | None = None, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.in_features, self.out_features, self.row_wise = in_features, out_features, row_wise
        self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=dtype, device=device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x.to(self.weight.dtype), self.weight, self.row_wise)


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
