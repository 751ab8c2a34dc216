"""Request-level edits of the logits before sampling, and the log-probabilities users ask for.

:func:`apply_batched_edits` is what the sampler runs: every edit over all rows of a step at once, each row
with its own parameters (:mod:`sampling_rows`), the penalties reading the sampler's device history
tables. :func:`apply_logits_processors` is the same edits over one request's ``[vocab]`` logits with a
:class:`SequenceHistory`, the per-row reference the batched form is tested against. Order (as in the
OpenAI / vLLM semantics):

1. ``logit_bias``: add each bias to its token's logit;
2. ``repetition_penalty`` r: every token already in the sequence (prompt or output) has its logit
   divided by r when positive, multiplied by r when negative;
3. ``frequency_penalty`` f and ``presence_penalty`` p: subtract ``f * count + p * (count > 0)``, where
   ``count`` is how often the token was generated so far (output only);
4. ``min_tokens``: while fewer tokens than that were generated, the end-of-sequence token and the
   ``stop_token_ids`` are impossible (-inf).

:class:`SequenceHistory` is the per-request state these need (output counts, the set of seen
tokens, how many were generated). The sampler keeps the same state as rows of two device tables,
built from the request's prompt and output ids, which the scheduler ships once, on the first step
after each admission (``ScheduledSeq.history``; a preempted request is re-admitted, so its history is
rebuilt then), updated on the device with every token it samples, and dropped when the request's
tables are released.

Log-probabilities are those of the model's distribution, ``log_softmax`` of the raw logits (before
the edits above and before temperature / top-k / top-p), like OpenAI's ``logprobs``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from atom.sampling_params import SamplingParams

if TYPE_CHECKING:
    from atom.model_executor.sampling_rows import DeviceRows, RowBatch

__all__ = ["SequenceHistory", "apply_batched_edits", "apply_logits_processors", "token_logprobs"]


@dataclass
class SequenceHistory:
    """Per-request token history for the penalties (tensors of length ``vocab``)."""

    counts: torch.Tensor  # int32: times each token was generated
    seen: torch.Tensor  # bool: the token occurs in the prompt or the output
    num_generated: int = 0

    @classmethod
    def of(cls, prompt: tuple[int, ...], output: tuple[int, ...], vocab: int,
           device: torch.device) -> "SequenceHistory":
        """The history of a request whose prompt and generated ids so far are given."""
        seen = torch.zeros(vocab, dtype=torch.bool, device=device)
        counts = torch.zeros(vocab, dtype=torch.int32, device=device)
        if prompt or output:
            seen[torch.tensor(prompt + output, dtype=torch.long, device=device)] = True
        if output:
            ids = torch.tensor(output, dtype=torch.long, device=device)
            counts.index_add_(0, ids, torch.ones_like(ids, dtype=torch.int32))
        return cls(counts, seen, len(output))

    def generated(self, token_id: int) -> None:
        self.counts[token_id] += 1
        self.seen[token_id] = True
        self.num_generated += 1


def apply_logits_processors(logits: torch.Tensor, params: SamplingParams, history: SequenceHistory | None,
                            banned_until_min: tuple[int, ...]) -> torch.Tensor:
    """The edited fp32 logits (a new tensor; ``logits`` is not modified)."""
    out = logits.float().clone()
    if params.logit_bias:
        ids = torch.tensor([t for t, _ in params.logit_bias], dtype=torch.long, device=out.device)
        bias = torch.tensor([b for _, b in params.logit_bias], dtype=out.dtype, device=out.device)
        out.index_add_(0, ids, bias)
    if history is None:
        return out
    if params.repetition_penalty != 1.0:
        r = params.repetition_penalty
        out = torch.where(history.seen, torch.where(out > 0, out / r, out * r), out)
    if params.frequency_penalty or params.presence_penalty:
        counts = history.counts.to(out.dtype)
        out = out - params.frequency_penalty * counts - params.presence_penalty * (counts > 0).to(out.dtype)
    if history.num_generated < params.min_tokens and banned_until_min:
        out[torch.tensor(banned_until_min, dtype=torch.long, device=out.device)] = float("-inf")
    return out


def apply_batched_edits(logits: torch.Tensor, rows: "DeviceRows", batch: "RowBatch",
                        counts: torch.Tensor | None, seen: torch.Tensor | None) -> torch.Tensor:
    """The edited fp32 logits ``[N, vocab]`` of a step (a new tensor when any edit applies): the edits of
    :func:`apply_logits_processors` per row, in the same order; ``counts`` / ``seen``: the history
    tables (row ``rows.slot[n]``, row 0 all zero), read only when a row has history."""
    out = logits.float()
    if not (batch.any_bias or batch.any_history or batch.any_banned):
        return out
    out = out.clone()
    if batch.any_bias:
        out.index_put_(rows.bias[:2], rows.bias[2], accumulate=True)
    if batch.any_history:
        seen_rows, count_rows = seen[rows.slot], counts[rows.slot].to(out.dtype)
        r = rows.repetition.unsqueeze(-1)
        out = torch.where(seen_rows, torch.where(out > 0, out / r, out * r), out)
        out = (out - rows.frequency.unsqueeze(-1) * count_rows
               - rows.presence.unsqueeze(-1) * (count_rows > 0).to(out.dtype))
    if batch.any_banned:
        out.index_put_(rows.banned, torch.full_like(rows.banned[0], 0, dtype=out.dtype) - float("inf"))
    return out


def token_logprobs(logits: torch.Tensor, token_id: int, top: int) -> tuple[float, tuple[tuple[int, float], ...]]:
    """``(logprob of token_id, the top ``top`` (id, logprob) pairs, most likely first)``."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    chosen = float(logp[token_id])
    if top <= 0:
        return chosen, ()
    values, ids = torch.topk(logp, min(top, logp.numel()))
    return chosen, tuple((int(i), float(v)) for i, v in zip(ids.tolist(), values.tolist()))
