"""Sampling the next token from logits: greedy, temperature, top-k, min-p, top-p, reproducible with a seed.

A request with a ``seed`` draws each token from a generator seeded by ``(seed, position)``, so the
same seed gives the same tokens whatever else runs in the batch, and a request preempted and
recomputed continues exactly as if it had never been interrupted. Requests without a seed share the
engine's generator.

Before sampling, the request's logits edits (``logit_bias``, repetition / frequency / presence
penalties, ``min_tokens``) are applied by :mod:`logits_processors`, which also computes the
log-probabilities a request asks for; the per-request history those need lives here, keyed by
sequence id, until the request is released.
"""

from __future__ import annotations

from typing import Iterable

import torch

from atom.output.request_output import TokenLogprobs
from atom.model_executor.logits_processors import SequenceHistory, apply_logits_processors, token_logprobs
from atom.spec_decode.rejection_sampler import greedy_accept, rejection_sample
from atom.sampling_params import SamplingParams

__all__ = ["Sampler"]


class Sampler:
    """``eos_token_id``: the token ``min_tokens`` forbids (with ``stop_token_ids``) until reached.
    Samples on the logits' device; generators live on ``device``."""

    def __init__(self, seed: int = 0, eos_token_id: int | None = None, device: str | torch.device = "cpu") -> None:
        self.device = torch.device(device)
        self._shared = torch.Generator(device=self.device).manual_seed(seed)
        self._eos = eos_token_id
        self._history: dict[int, SequenceHistory] = {}

    def sample_all(self, logits: torch.Tensor, params: list[SamplingParams], positions: list[int],
                   seq_ids: list[int]) -> list[int]:
        """One token per row of ``logits [K, vocab]`` (row ``r``: ``params[r]`` of request ``seq_ids[r]`` at
        ``positions[r]``). Plain greedy rows take one batched argmax; the step's tokens come back to the
        host in one read. Rows with logits edits or sampling go through :meth:`sample`."""
        if not params:
            return []
        tokens = torch.argmax(logits, dim=-1)
        for r, (p, pos, sid) in enumerate(zip(params, positions, seq_ids)):
            if not (p.greedy and self._plain(p, sid)):
                tokens[r] = self.sample(logits[r], p, pos, sid)
        return tokens.tolist()

    def _plain(self, params: SamplingParams, seq_id: int) -> bool:
        """No logits edit applies: greedy is then the raw argmax."""
        return not params.logit_bias and self._history.get(seq_id) is None

    # ---- per-request history ------------------------------------------------------------------
    def begin(self, seq_id: int, prompt: tuple[int, ...], output: tuple[int, ...], vocab: int,
              device: torch.device) -> None:
        """A request (re)admitted with penalties or min_tokens: its history from its ids so far."""
        self._history[seq_id] = SequenceHistory.of(prompt, output, vocab, device)

    def release(self, seq_ids: Iterable[int]) -> None:
        for sid in seq_ids:
            self._history.pop(sid, None)

    # ---- sampling -----------------------------------------------------------------------------
    def sample(self, logits: torch.Tensor, params: SamplingParams, position: int, seq_id: int | None = None) -> int:
        """One token from ``logits [vocab]`` for the token at ``position`` of its request ``seq_id``
        (whose history, if :meth:`begin` set one, the penalties read and this token extends)."""
        history = self._history.get(seq_id) if seq_id is not None else None
        edited = apply_logits_processors(logits, params, history, self._banned(params))
        if params.greedy:
            token = int(torch.argmax(edited))
        else:
            probs = self.filtered_probs(edited / params.temperature, params)
            token = int(torch.multinomial(probs, 1, generator=self._generator(params, position)))
        if history is not None:
            history.generated(token)
        return token

    def verify(self, logits: torch.Tensor, drafts: tuple[int, ...], params: SamplingParams, position: int,
               argmax: list[int] | None = None) -> tuple[int, int]:
        """``(accepted, token)`` for ``k`` deterministic drafts: ``logits [k + 1, vocab]`` are the target's
        rows from the last committed token on, row ``i`` giving the token at ``position + i``. Greedy:
        exact match with the argmax (``argmax``: those rows' argmax, already read back); otherwise
        rejection sampling against the filtered distribution, one generator per position. The
        scheduler never drafts for requests whose params edit logits (see ``Scheduler._propose``)."""
        if params.greedy:
            return greedy_accept(argmax if argmax is not None else torch.argmax(logits, dim=-1).tolist(), drafts)
        probs = torch.stack([self.filtered_probs(row / params.temperature, params) for row in logits])
        return rejection_sample(probs, drafts, None,
                                [self._generator(params, position + i) for i in range(len(drafts) + 1)])

    @staticmethod
    def logprobs(logits: torch.Tensor, params: SamplingParams, token: int) -> TokenLogprobs | None:
        """The log-probabilities ``params.logprobs`` asks for (None when it does not)."""
        if params.logprobs is None:
            return None
        chosen, top = token_logprobs(logits, token, params.logprobs)
        return TokenLogprobs(token, chosen, top)

    def _banned(self, params: SamplingParams) -> tuple[int, ...]:
        if params.min_tokens <= 0:
            return ()
        return tuple(params.stop_token_ids) + (() if self._eos is None else (self._eos,))

    def _generator(self, params: SamplingParams, position: int) -> torch.Generator:
        if params.seed is None:
            return self._shared
        return torch.Generator(device=self.device).manual_seed((params.seed * 1_000_003 + position) % (1 << 63))

    @staticmethod
    def filtered_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
        """The distribution a token is drawn from: softmax of ``logits [vocab]`` (already divided by the
        temperature) restricted to the ``top_k`` largest, then to the tokens at least ``min_p`` times as
        likely as the most likely one, then to the smallest most-likely set whose mass reaches ``top_p``;
        renormalised after each filter. Only tensor operations: nothing is read back to the host."""
        if params.top_k and params.top_k < logits.numel():
            kth = torch.topk(logits, params.top_k).values[-1]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        if params.min_p > 0.0:
            probs = torch.where(probs >= params.min_p * probs.max(), probs, torch.zeros_like(probs))
            probs = probs / probs.sum()
        if params.top_p < 1.0:
            sorted_p, order = torch.sort(probs, descending=True)
            keep = torch.cumsum(sorted_p, 0) - sorted_p < params.top_p  # always keeps the most likely token
            mask = torch.empty_like(keep).scatter_(0, order, keep)  # back to vocabulary order, no host read
            probs = torch.where(mask, probs, torch.zeros_like(probs))
            probs = probs / probs.sum()
        return probs
