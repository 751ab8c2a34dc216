"""Sampling parameters of one request, validated at the boundary (bad input raises ValueError)."""

from __future__ import annotations

from dataclasses import dataclass, field

from atom.validation import require_int

__all__ = ["SamplingParams"]


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each output token and when to stop.

    ``temperature == 0`` is greedy. ``top_k == 0`` and ``top_p == 1`` disable those filters.
    ``seed`` makes sampling reproducible per request. Generation stops at ``max_tokens``, at an
    end-of-sequence token (unless ``ignore_eos``), at any of ``stop_token_ids``, or (text level, in
    the engine) at any of ``stop`` strings.
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = field(default_factory=tuple)
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        require_int("max_tokens", self.max_tokens, 1)
        if not isinstance(self.temperature, (int, float)) or not 0.0 <= self.temperature <= 100.0:
            raise ValueError(f"temperature={self.temperature!r} must be a number in [0, 100]")
        if not isinstance(self.top_p, (int, float)) or not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p={self.top_p!r} must be a number in (0, 1]")
        require_int("top_k", self.top_k, 0, note="0 = off")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise ValueError(f"seed={self.seed!r} must be an integer or None")
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        if any(not isinstance(s, str) or not s for s in stop):
            raise ValueError(f"stop={self.stop!r} must be non-empty strings")
        object.__setattr__(self, "stop", stop)
        ids = tuple(self.stop_token_ids)
        if any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in ids):
            raise ValueError(f"stop_token_ids={self.stop_token_ids!r} must be non-negative integers")
        object.__setattr__(self, "stop_token_ids", ids)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
