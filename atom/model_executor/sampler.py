"""Sampling the next token from logits: greedy, temperature, top-k, top-p, reproducible with a seed.

A request with a ``seed`` draws each token from a generator seeded by ``(seed, position)``, so the
same seed gives the same tokens whatever else runs in the batch, and a request preempted and
recomputed continues exactly as if it had never been interrupted. Requests without a seed share the
engine's generator.
"""

from __future__ import annotations

import torch

from atom.sampling_params import SamplingParams

__all__ = ["Sampler"]


class Sampler:
    def __init__(self, seed: int = 0) -> None:
        self._shared = torch.Generator().manual_seed(seed)

    def sample(self, logits: torch.Tensor, params: SamplingParams, position: int) -> int:
        """One token from fp32 ``logits [vocab]`` for the token at ``position`` of its request."""
        if params.greedy:
            return int(torch.argmax(logits))
        probs = self._filtered_probs(logits.float() / params.temperature, params)
        return int(torch.multinomial(probs, 1, generator=self._generator(params, position)))

    def _generator(self, params: SamplingParams, position: int) -> torch.Generator:
        if params.seed is None:
            return self._shared
        return torch.Generator().manual_seed((params.seed * 1_000_003 + position) % (1 << 63))

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
