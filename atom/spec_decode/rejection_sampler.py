"""Verifying drafted tokens against the target model: exact match (greedy) or rejection sampling.

Rejection sampling (speculative sampling): draft ``d_i`` was drawn from the draft distribution
``q_i`` (a one-hot row for a deterministic draft such as an argmax or a replayed token); the target
model gives ``p_i`` at the same position. Accept ``d_i`` with probability ``min(1, p_i(d_i) / q_i(d_i))``;
at the first rejection, draw the token from the residual ``max(p_i - q_i, 0)`` normalised and stop; when
every draft is accepted, draw a bonus token from ``p_k``. Every emitted token is then distributed
exactly as ``p`` (the target distribution), whatever the drafts were. Each position draws from its own
generator (``generators[i]``), so a request with a seed is reproducible.
"""

from __future__ import annotations

from typing import Sequence as Seq

import torch

__all__ = ["greedy_accept", "rejection_sample"]


def greedy_accept(target_tokens: Seq[int], drafts: Seq[int]) -> tuple[int, int]:
    """``(accepted, token)``: ``target_tokens[i]`` is the target's argmax after draft ``i`` (``k + 1`` of
    them for ``k`` drafts); drafts are accepted while they equal it; ``token`` is the target's next one."""
    assert len(target_tokens) == len(drafts) + 1
    a = 0
    while a < len(drafts) and drafts[a] == target_tokens[a]:
        a += 1
    return a, int(target_tokens[a])


def rejection_sample(target_probs: torch.Tensor, drafts: Seq[int], draft_probs: torch.Tensor | None,
                     generators: Seq[torch.Generator | None]) -> tuple[int, int]:
    """``(accepted, token)`` for ``k`` drafts: ``target_probs [k + 1, vocab]`` (rows sum to 1), ``draft_probs
    [k, vocab]`` the distributions the drafts were drawn from (None: one-hot, deterministic drafts),
    ``generators``: ``k + 1`` generators (None: torch's default), one per position."""
    k = len(drafts)
    assert target_probs.shape[0] == k + 1 and len(generators) == k + 1
    for i, d in enumerate(drafts):
        p = target_probs[i]
        q = torch.zeros_like(p) if draft_probs is None else draft_probs[i]
        if draft_probs is None:
            q[d] = 1.0
        u = torch.rand((), generator=generators[i], device=p.device, dtype=p.dtype)
        if u * q[d] < p[d]:  # u < p(d) / q(d), without dividing by a zero q(d)
            continue
        residual = (p - q).clamp(min=0)
        total = residual.sum()
        residual = residual / total if total > 0 else p
        return i, int(torch.multinomial(residual, 1, generator=generators[i]))
    return k, int(torch.multinomial(target_probs[k], 1, generator=generators[k]))
