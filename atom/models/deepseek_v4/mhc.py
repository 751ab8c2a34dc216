"""Manifold-constrained hyper-connections (mHC): the residual stream is ``hc_mult`` copies of the hidden state.

For each sub-layer (attention, FFN) the copies ``h [T, hc, d]`` are flattened, RMS-normalised without weight and
projected by ``fn [(2+hc)*hc, hc*d]`` into mixing logits:

* ``pre  = sigmoid(mix[:hc] * s0 + b) + eps``        -> sub-layer input ``y = sum_k pre_k h_k``
* ``post = 2 * sigmoid(mix[hc:2hc] * s1 + b)``
* ``comb``: ``mix[2hc:]`` as ``[hc, hc]`` logits ``* s2 + b``; row softmax, ``+ eps``, one column normalisation,
  then ``iters - 1`` rounds of (row, column) normalisation, each with ``+ eps`` in the denominator.
* output ``h'_k = post_k * f(y) + sum_j comb[j, k] h_j``.

The final head gate uses ``pre = sigmoid(mix * s + b) + eps`` only.  Everything is per token and fp32; sums over
the ``hc`` copies are written as explicit loops (fixed order).
"""

from __future__ import annotations

import torch

import torch.nn.functional as F


def hc_mixes(h: torch.Tensor, fn: torch.Tensor, eps: float) -> torch.Tensor:
    """Mixing logits ``[T, rows(fn)]`` of the weightless-RMS-normalised flattened stream ``h [T, hc, d]``."""
    x = h.flatten(1).float()
    rsqrt = torch.rsqrt(x.square().mean(-1, keepdim=True) + eps)
    return F.linear(x, fn.float()) * rsqrt


def sinkhorn_split(mixes: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, hc: int, iters: int,
                   eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(pre [T, hc], post [T, hc], comb [T, hc, hc])`` from the mixing logits (see module docstring)."""
    pre = torch.sigmoid(mixes[:, :hc] * scale[0] + base[:hc]) + eps
    post = 2 * torch.sigmoid(mixes[:, hc : 2 * hc] * scale[1] + base[hc : 2 * hc])
    comb = mixes[:, 2 * hc :].reshape(-1, hc, hc) * scale[2] + base[2 * hc :].reshape(hc, hc)
    comb = comb.softmax(dim=-1) + eps
    comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        comb = comb / (comb.sum(dim=-1, keepdim=True) + eps)
        comb = comb / (comb.sum(dim=-2, keepdim=True) + eps)
    return pre, post, comb


def weighted_copies(h: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
    """``sum_k pre[:, k] * h[:, k]``: ``[T, hc, d], [T, hc] -> [T, d]`` (fp32, fixed summation order)."""
    hf = h.float()
    y = pre[:, 0:1] * hf[:, 0]
    for k in range(1, h.shape[1]):
        y = y + pre[:, k : k + 1] * hf[:, k]
    return y


def hc_pre(h: torch.Tensor, fn: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, iters: int, eps: float,
           norm_eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sub-layer input ``y [T, d]`` plus the ``post`` and ``comb`` weights used by ``hc_post``."""
    hc = h.shape[1]
    pre, post, comb = sinkhorn_split(hc_mixes(h, fn, norm_eps), scale, base, hc, iters, eps)
    return weighted_copies(h, pre).to(h.dtype), post, comb


def hc_post(y: torch.Tensor, residual: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    """``h'_k = post_k * y + sum_j comb[j, k] * residual_j`` -> ``[T, hc, d]``."""
    hc = residual.shape[1]
    yf, rf = y.float(), residual.float()
    outs = []
    for k in range(hc):
        acc = post[:, k : k + 1] * yf
        for j in range(hc):
            acc = acc + comb[:, j, k : k + 1] * rf[:, j]
        outs.append(acc)
    return torch.stack(outs, dim=1).to(residual.dtype)


def hc_head(h: torch.Tensor, fn: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, eps: float,
            norm_eps: float) -> torch.Tensor:
    """Final collapse of the copies before the head: ``pre = sigmoid(mix * s + b) + eps``, weighted sum."""
    pre = torch.sigmoid(hc_mixes(h, fn, norm_eps) * scale[0] + base) + eps
    return weighted_copies(h, pre).to(h.dtype)
