"""Sampling parameters of one request, validated at the boundary (bad input raises ValueError)."""

from __future__ import annotations

from dataclasses import dataclass, field

from atom.validation import require_int

__all__ = ["SamplingParams"]


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each output token and when to stop.

    ``temperature == 0`` is greedy. ``top_k == 0``, ``top_p == 1`` and ``min_p == 0`` disable those
    filters (``min_p``: tokens less likely than ``min_p`` times the most likely one are dropped).
    ``seed`` makes sampling reproducible per request. Generation stops at ``max_tokens``, at an
    end-of-sequence token (unless ``ignore_eos``), at any of ``stop_token_ids``, or (text level, in
    the engine) at any of ``stop`` strings; ``min_tokens`` forbids the first two until that many
    tokens were generated. ``logit_bias`` ((token id, bias) pairs), ``repetition_penalty`` (1 = off),
    ``frequency_penalty`` and ``presence_penalty`` (0 = off) edit the logits
    (``atom/model_executor/logits_processors.py``). ``logprobs``: None = none, k >= 0 = the sampled
    token's log-probability and the k most likely alternatives. ``include_stop_str_in_output``: the
    text ends after the stop string that matched instead of before it, and keeps the text of the stop
    token id that ended it (never the end-of-sequence token's). ``skip_special_tokens``: leave
    special tokens out of the text (chat markers that the answer parser reads need them in).
    """

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = field(default_factory=tuple)
    stop_token_ids: tuple[int, ...] = field(default_factory=tuple)
    ignore_eos: bool = False
    min_tokens: int = 0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: tuple[tuple[int, float], ...] = field(default_factory=tuple)
    logprobs: int | None = None
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False

    def __post_init__(self) -> None:
        require_int("max_tokens", self.max_tokens, 1)
        if not isinstance(self.temperature, (int, float)) or not 0.0 <= self.temperature <= 100.0:
            raise ValueError(f"temperature={self.temperature!r} must be a number in [0, 100]")
        if not isinstance(self.top_p, (int, float)) or not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p={self.top_p!r} must be a number in (0, 1]")
        require_int("top_k", self.top_k, 0, note="0 = off")
        if isinstance(self.min_p, bool) or not isinstance(self.min_p, (int, float)) or not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p={self.min_p!r} must be a number in [0, 1] (0 = off)")
        for name in ("skip_special_tokens", "include_stop_str_in_output"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name}={getattr(self, name)!r} must be true or false")
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
        self._check_edits()

    def _check_edits(self) -> None:
        if isinstance(self.min_tokens, bool) or not isinstance(self.min_tokens, int) or \
                not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(f"min_tokens={self.min_tokens!r} must be an integer in [0, max_tokens={self.max_tokens}]")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not -2.0 <= value <= 2.0:
                raise ValueError(f"{name}={value!r} must be a number in [-2, 2]")
        r = self.repetition_penalty
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not 0.0 < r <= 10.0:
            raise ValueError(f"repetition_penalty={r!r} must be a number in (0, 10] (1 = off)")
        bias = tuple(self.logit_bias)
        for pair in bias:
            if (not isinstance(pair, tuple) or len(pair) != 2 or isinstance(pair[0], bool)
                    or not isinstance(pair[0], int) or pair[0] < 0 or isinstance(pair[1], bool)
                    or not isinstance(pair[1], (int, float)) or not -100.0 <= pair[1] <= 100.0):
                raise ValueError(f"logit_bias={self.logit_bias!r} must map token ids >= 0 to numbers in [-100, 100]")
        object.__setattr__(self, "logit_bias", bias)
        lp = self.logprobs
        if lp is not None and (isinstance(lp, bool) or not isinstance(lp, int) or not 0 <= lp <= 20):
            raise ValueError(f"logprobs={lp!r} must be None or an integer in [0, 20]")

    @property
    def needs_history(self) -> bool:
        """The logits edits depend on the request's earlier tokens (penalties, min_tokens)."""
        return (self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0
                or self.min_tokens > 0)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
