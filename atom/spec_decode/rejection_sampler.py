"""Verifying drafted tokens against the target model, batched over every row of a step: exact match
(greedy) or rejection sampling, with no value read back.

Rejection sampling (speculative sampling): draft ``d_i`` was drawn from the draft distribution
``q_i`` (a one-hot row for a deterministic draft such as an argmax or a replayed token); the target
model gives ``p_i`` at the same position. Accept ``d_i`` with probability ``min(1, p_i(d_i) / q_i(d_i))``;
at the first rejection, draw the token from the residual ``max(p_i - q_i, 0)`` normalised and stop; when
every draft is accepted, draw a bonus token from ``p_k``. Every emitted token is then distributed
exactly as ``p`` (the target distribution), whatever the drafts were.

Batched form. A request with ``k`` drafts owns ``k + 1`` rows; every row computes its own outcome at
once (:func:`row_outcomes`: was its draft accepted, and which token it would emit if the request stopped
there), and :func:`first_rejection` takes, per request, the number of leading accepted drafts ``a``
(a cumulative product) and the candidate of row ``a``. Random numbers come as a ``[rows, vocab + 1]``
block of uniforms per row (the sampler's counter-based generator, keyed by the row's seed and
position): column ``vocab`` is the acceptance test, the others the exponential race
``argmax(r / -log(u))`` that draws from ``r`` without normalising it.
"""

from __future__ import annotations

import torch

__all__ = ["accept_drafts", "first_rejection", "row_outcomes"]


def row_outcomes(probs: torch.Tensor, noise: torch.Tensor, draft: torch.Tensor,
                 draft_probs: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(accepted [N] bool, candidate [N] int64)`` per row: ``probs [N, V]`` the target (rows sum to 1),
    ``noise [N, V + 1]`` uniforms in (0, 1), ``draft [N]`` the draft the row verifies (-1: none, the
    row's candidate is drawn from ``probs``), ``draft_probs [N, V]`` the draft distributions (None:
    one-hot drafts)."""
    vocab = probs.shape[-1]
    has_draft = draft >= 0
    d = draft.clamp(min=0).unsqueeze(-1)
    p_d = probs.gather(-1, d).squeeze(-1)
    if draft_probs is None:
        q = torch.zeros_like(probs).scatter_(-1, d, 1.0)
    else:
        q = draft_probs
    q_d = q.gather(-1, d).squeeze(-1)
    accepted = has_draft & (noise[:, vocab] * q_d < p_d)  # u < p(d) / q(d) without dividing by a zero q(d)
    residual = torch.where(has_draft.unsqueeze(-1), (probs - q).clamp(min=0), probs)
    residual = torch.where(residual.sum(-1, keepdim=True) > 0, residual, probs)
    candidate = torch.argmax(residual / -torch.log(noise[:, :vocab]), dim=-1)
    return accepted, candidate


def first_rejection(accepted: torch.Tensor, candidate: torch.Tensor, request_rows: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(accepted drafts [R], token [R])`` per request: ``request_rows [R, K + 1]`` its rows in order,
    padded by repeating its last row (which verifies no draft, so the count stops there)."""
    acc = accepted[request_rows].to(torch.int64)
    count = torch.cumprod(acc, dim=-1).sum(-1)
    token = candidate[request_rows].gather(-1, count.unsqueeze(-1)).squeeze(-1)
    return count, token


def accept_drafts(greedy: torch.Tensor, probs: torch.Tensor | None, noise: torch.Tensor | None, rows,
                  max_drafts: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(accepted [R], token [R])`` for the step's requests (``rows``: the sampler's ``DeviceRows``).
    Greedy rows (temperature 0) accept a draft equal to their argmax ``greedy [N]`` and emit the argmax;
    sampling rows go through :func:`row_outcomes` with one-hot drafts. ``probs`` / ``noise`` are None
    when no row samples."""
    if probs is None:
        accepted, candidate = (rows.draft >= 0) & (rows.draft == greedy), greedy
    else:
        acc_s, cand_s = row_outcomes(probs, noise, rows.draft)
        is_greedy = rows.temperature == 0
        accepted = torch.where(is_greedy, (rows.draft >= 0) & (rows.draft == greedy), acc_s)
        candidate = torch.where(is_greedy, greedy, cand_s)
    if max_drafts == 0:  # one row per request
        return torch.zeros_like(candidate), candidate
    return first_rejection(accepted, candidate, rows.request_rows)
