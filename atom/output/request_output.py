"""What the engine reports to its users: per-request outputs (streamed per step) and engine stats."""

from __future__ import annotations

from dataclasses import dataclass, field

from atom.kv.host_pool import HostTierStats
from atom.kv.prefix_stats import PrefixStats

__all__ = ["RequestOutput", "EngineStats", "ReplicaStats", "TokenLogprobs"]


@dataclass(frozen=True, slots=True)
class TokenLogprobs:
    """Log-probability of a sampled token and the ``top`` most likely (id, logprob), best first."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass
class RequestOutput:
    """A request's state after a step. ``new_*`` hold what this step added (for streaming).

    The cumulative fields ``prompt_token_ids``, ``output_token_ids`` and ``text`` are filled in the
    final output (``finished=True``) only, and are empty before: copying them at every step would
    cost O(length) per token. ``num_output_tokens`` is always current. ``text`` is the
    concatenation of every ``new_text``. ``finish_reason``: "stop", "length" or "abort"."""

    request_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    new_token_ids: list[int]
    text: str
    new_text: str
    finished: bool
    finish_reason: str | None
    num_cached_tokens: int
    stats: PrefixStats = field(default_factory=PrefixStats)
    error: str | None = None
    num_output_tokens: int = 0
    new_logprobs: list[TokenLogprobs] = field(default_factory=list)  # of new_token_ids, when asked for


@dataclass(frozen=True)
class ReplicaStats:
    """One attention replica under data parallelism (its own scheduler and arena): arena bytes per owner
    and free, requests running and waiting, prompt tokens admitted and served from its prefix cache,
    preemptions, and the steps it ran as padding (nothing to run while another replica stepped) with
    their tokens."""

    arena_bytes: dict[str, int]
    num_running: int
    num_waiting: int
    prompt_tokens: int
    hit_tokens: int
    num_preemptions: int
    padding_steps: int
    padding_tokens: int


@dataclass
class EngineStats:
    """Counters and gauges for metrics. Arena bytes are whole chunks per owner; ``prefix``: where the
    prompt tokens of every admitted request came from (totals, first admission only)."""

    arena_bytes: dict[str, int]
    num_running: int
    num_waiting: int
    num_preemptions: int
    prefix: PrefixStats
    generation_tokens: int
    # speculative decoding (all 0 when off): request-steps that verified drafts, drafts proposed and
    # accepted, per draft position; mean acceptance length = tokens per verifying request-step
    spec_verifies: int = 0
    spec_proposed: int = 0
    spec_accepted: int = 0
    spec_proposed_at: tuple[int, ...] = ()
    spec_accepted_at: tuple[int, ...] = ()
    # data-parallel attention (empty / 0 with one replica): each replica, and the padding totals (the
    # fields above are then sums over the replicas)
    replicas: tuple[ReplicaStats, ...] = ()
    padding_steps: int = 0
    padding_tokens: int = 0
    # the host KV tier (None when off): hit tokens, bytes each way, pool use, load wait
    host: HostTierStats | None = None

    @property
    def spec_mean_acceptance_length(self) -> float:
        return (self.spec_accepted + self.spec_verifies) / self.spec_verifies if self.spec_verifies else 0.0
