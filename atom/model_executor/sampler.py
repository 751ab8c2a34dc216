"""Sampling the next token from logits: greedy, temperature, top-k, top-p, reproducible with a seed.

A request with a ``seed`` gets its own generator (seeded once, advanced by each of its samples), so
the same seed gives the same tokens whatever else runs in the batch. Requests without one share the
engine's generator.
"""

from __future__ import annotations

import torch

from atom.sampling_params import SamplingParams

__all__ = ["Sampler"]


class Sampler:
    def __init__(self, seed: int = 0) -> None:
        self._shared = torch.Generator().manual_seed(seed)
        self._per_request: dict[int, torch.Generator] = {}

    def forget(self, seq_id: int) -> None:
        self._per_request.pop(seq_id, None)

    def sample(self, seq_id: int, logits: torch.Tensor, params: SamplingParams) -> int:
        """One token from fp32 ``logits [vocab]``."""
        if params.greedy:
            return int(torch.argmax(logits))
        probs = self._filtered_probs(logits.float() / params.temperature, params)
        return int(torch.multinomial(probs, 1, generator=self._generator(seq_id, params)))

    def _generator(self, seq_id: int, params: SamplingParams) -> torch.Generator:
        if params.seed is None:
            return self._shared
        gen = self._per_request.get(seq_id)
        if gen is None:
            gen = self._per_request[seq_id] = torch.Generator().manual_seed(params.seed)
        return gen

    @staticmethod
    def _filtered_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
        if params.top_k and params.top_k < logits.numel():
            kth = torch.topk(logits, params.top_k).values[-1]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        probs = torch.softmax(logits, dim=-1)
        if params.top_p < 1.0:
            sorted_p, order = torch.sort(probs, descending=True)
            keep = torch.cumsum(sorted_p, 0) - sorted_p < params.top_p  # always keeps the most likely token
            mask = torch.zeros_like(probs, dtype=torch.bool)
            mask[order[keep]] = True
            probs = torch.where(mask, probs, torch.zeros_like(probs))
            probs = probs / probs.sum()
        return probs
