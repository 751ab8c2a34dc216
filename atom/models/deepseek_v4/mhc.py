"""Manifold-constrained hyper-connections (mHC): the residual stream is ``hc_mult`` copies of the hidden state.

For each sub-layer (attention, FFN) the copies ``h [T, hc, d]`` are flattened, RMS-normalised without weight and
projected by ``fn [(2+hc)*hc, hc*d]`` into mixing logits:

* ``pre  = sigmoid(mix[:hc] * s0 + b) + eps``        -> sub-layer input ``y = sum_k pre_k h_k``
* ``post = 2 * sigmoid(mix[hc:2hc] * s1 + b)``
* ``comb``: ``mix[2hc:]`` as ``[hc, hc]`` logits ``* s2 + b``; row softmax, ``+ eps``, one column normalisation,
  then ``iters - 1`` rounds of (row, column) normalisation, each with ``+ eps`` in the denominator.
* output ``h'_k = post_k * f(y) + sum_j comb[j, k] h_j``.

The final head gate uses ``pre = sigmoid(mix * s + b) + eps`` only.  Everything is per token and fp32; sums over
the ``hc`` copies run in a fixed order (one sum over a stacked dim).  The Sinkhorn iterations are one op,
``torch.ops.atom.hc_sinkhorn`` (:mod:`atom.kernels.hc_sinkhorn`), so a step's op count does not grow with them.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

import atom.kernels.hc_sinkhorn  # noqa: F401  (registers torch.ops.atom.hc_sinkhorn)


def hc_mixes(h: torch.Tensor, fn: torch.Tensor, eps: float) -> torch.Tensor:
    """Mixing logits ``[T, rows(fn)]`` of the weightless-RMS-normalised flattened stream ``h [T, hc, d]``."""
    x = h.flatten(1).float()
    rsqrt = torch.rsqrt(x.square().mean(-1, keepdim=True) + eps)
    return F.linear(x, fn.float()) * rsqrt


def sinkhorn_split(mixes: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, hc: int, iters: int,
                   eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(pre [T, hc], post [T, hc], comb [T, hc, hc])`` from the mixing logits (see module docstring)."""
    widths = (hc, hc, hc * hc)
    (m_pre, m_post, m_comb), (b_pre, b_post, b_comb) = mixes.split(widths, dim=1), base.split(widths)
    s_pre, s_post, s_comb = scale.unbind()  # one op each for the slices and selects of the three groups
    pre = torch.sigmoid(m_pre * s_pre + b_pre) + eps
    post = 2 * torch.sigmoid(m_post * s_post + b_post)
    comb = m_comb.reshape(-1, hc, hc) * s_comb + b_comb.reshape(hc, hc)
    return pre, post, torch.ops.atom.hc_sinkhorn(comb.float().contiguous(), iters, float(eps))


def weighted_copies(h: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
    """``sum_k pre[:, k] * h[:, k]``: ``[T, hc, d], [T, hc] -> [T, d]`` (fp32; a sum over dim 1, which adds the
    copies in order k = 0, 1, ..., like an explicit loop)."""
    return (pre[:, :, None] * h.float()).sum(dim=1)


def hc_pre(h: torch.Tensor, fn: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, iters: int, eps: float,
           norm_eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sub-layer input ``y [T, d]`` plus the ``post`` and ``comb`` weights used by ``hc_post``."""
    hc = h.shape[1]
    pre, post, comb = sinkhorn_split(hc_mixes(h, fn, norm_eps), scale, base, hc, iters, eps)
    return weighted_copies(h, pre).to(h.dtype), post, comb


def hc_post(y: torch.Tensor, residual: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    """``h'_k = post_k * y + sum_j comb[j, k] * residual_j`` -> ``[T, hc, d]``."""
    terms = torch.cat((post[:, None, :, None] * y.float()[:, None, None, :],
                       comb[:, :, :, None] * residual.float()[:, :, None, :]), dim=1)  # [T, 1 + hc (j), hc (k), d]
    return terms.sum(dim=1).to(residual.dtype)  # post term first, then j = 0, 1, ... in order


def hc_head(h: torch.Tensor, fn: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, eps: float,
            norm_eps: float) -> torch.Tensor:
    """Final collapse of the copies before the head: ``pre = sigmoid(mix * s + b) + eps``, weighted sum."""
    pre = torch.sigmoid(hc_mixes(h, fn, norm_eps) * scale[0] + base) + eps
    return weighted_copies(h, pre).to(h.dtype)
