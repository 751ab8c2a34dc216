"""Prometheus metrics of one server (``GET /metrics``), in a registry of its own.

Two kinds of values:

* engine state and cumulative engine counters (arena bytes per owner, running / waiting requests,
  preemptions, prefix-cache queries / hits / attributed misses, tokens in and out; under data-parallel
  attention also each replica's arena, queue and hits, and the padding steps) come from
  ``LLMEngine.stats()`` (or ``DataParallelEngine.stats()``, the sums over the replicas); the route
  fetches a fresh snapshot on the engine thread at every scrape
  and :class:`_EngineStatsCollector` exposes it, so nothing is double counted or goes stale;
* per-request latencies (time to first token, time per output token, end-to-end latency) and
  finished requests by reason are observed by the routes as requests complete.

Each app owns its own ``CollectorRegistry``, so several servers can live in one process (tests).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from atom.output.request_output import EngineStats

__all__ = ["ServerMetrics", "CONTENT_TYPE_LATEST"]

_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                 10.0, 20.0, 40.0, 80.0, 160.0)
_TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4,
                 0.5, 0.75, 1.0, 2.5, 5.0)
_E2E_BUCKETS = (0.01, 0.05, 0.1, 0.3, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0)

#: (metric name without ``_total``, EngineStats field (``prefix.``: of ``EngineStats.prefix``), help) of
#: the cumulative engine counters. Prompt tokens are counted once, at a request's first admission, when
#: they are also looked up in the prefix cache: one value, one metric (the hit rate is
#: ``atom_prefix_cache_hits_total / atom_prompt_tokens_total``).
_COUNTERS = (
    ("atom_num_preemptions", "num_preemptions", "Requests preempted (their KV released) to make room."),
    ("atom_prompt_tokens", "prefix.prompt_tokens", "Prompt tokens admitted, each looked up in the prefix cache."),
    ("atom_prefix_cache_hits", "prefix.reused", "Prompt tokens served from the prefix cache."),
    ("atom_generation_tokens", "generation_tokens", "Tokens generated."),
    ("atom_spec_decode_verifies", "spec_verifies", "Request-steps that verified speculative drafts."),
    ("atom_spec_decode_num_draft_tokens", "spec_proposed", "Speculative draft tokens proposed and verified."),
    ("atom_spec_decode_num_accepted_tokens", "spec_accepted", "Speculative draft tokens accepted."),
)
#: miss attribution: label value -> field of ``EngineStats.prefix``.
_MISSES = (("evicted_kv", "lost_to_evicted_kv"), ("swa_window", "lost_to_swa_window"),
           ("csa_state", "lost_to_csa_state"))


class _EngineStatsCollector(Collector):
    """Exposes the latest ``EngineStats`` snapshot (nothing before the first scrape)."""

    def __init__(self) -> None:
        self.stats: "EngineStats | None" = None
        self.healthy = True

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily("atom_engine_healthy", "1 while the engine thread runs and its checks pass.",
                                value=1.0 if self.healthy else 0.0)
        s = self.stats
        if s is None:
            return
        arena = GaugeMetricFamily("atom_kv_arena_bytes", "KV arena bytes held per owner, and free.",
                                  labels=["owner"])
        for owner, nbytes in sorted(s.arena_bytes.items()):
            arena.add_metric([owner], float(nbytes))
        yield arena
        yield GaugeMetricFamily("atom_num_requests_running", "Requests being scheduled.", value=s.num_running)
        yield GaugeMetricFamily("atom_num_requests_waiting", "Requests queued for admission.", value=s.num_waiting)
        for name, field, doc in _COUNTERS:
            owner, _, leaf = field.rpartition(".")
            yield CounterMetricFamily(name, doc, value=float(getattr(getattr(s, owner) if owner else s, leaf)))
        misses = CounterMetricFamily("atom_prefix_cache_misses",
                                     "Prompt tokens not reused, by why their cached KV could not serve.",
                                     labels=["reason"])
        for label, field in _MISSES:
            misses.add_metric([label], float(getattr(s.prefix, field)))
        yield misses
        yield from _speculative(s)
        if s.host is not None:
            yield from _host_tier(s)
        if s.replicas:
            yield from _replicas(s)


def _replicas(s: "EngineStats") -> Iterator[Metric]:
    """Data-parallel attention: each replica's arena, queue and prefix-cache hits, and the padding steps
    (a replica with nothing to run while another ran a step)."""
    arena = GaugeMetricFamily("atom_replica_kv_arena_bytes", "KV arena bytes held per owner, and free, in each "
                              "attention replica's arena.", labels=["replica", "owner"])
    running = GaugeMetricFamily("atom_replica_num_requests_running", "Requests being scheduled, per replica.",
                                labels=["replica"])
    waiting = GaugeMetricFamily("atom_replica_num_requests_waiting", "Requests queued for admission, per replica.",
                                labels=["replica"])
    prompts = CounterMetricFamily("atom_replica_prompt_tokens", "Prompt tokens admitted, per replica.",
                                  labels=["replica"])
    hits = CounterMetricFamily("atom_replica_prefix_cache_hits", "Prompt tokens served from each replica's "
                               "prefix cache.", labels=["replica"])
    padding = CounterMetricFamily("atom_replica_padding_steps", "Steps a replica ran as padding (nothing to run "
                                  "while another replica stepped).", labels=["replica"])
    for d, r in enumerate(s.replicas):
        label = str(d)
        for owner, nbytes in sorted(r.arena_bytes.items()):
            arena.add_metric([label, owner], float(nbytes))
        running.add_metric([label], r.num_running)
        waiting.add_metric([label], r.num_waiting)
        prompts.add_metric([label], float(r.prompt_tokens))
        hits.add_metric([label], float(r.hit_tokens))
        padding.add_metric([label], float(r.padding_steps))
    yield from (arena, running, waiting, prompts, hits, padding)
    yield CounterMetricFamily("atom_padding_steps", "Replica-steps run as padding, all replicas.",
                              value=float(s.padding_steps))
    yield CounterMetricFamily("atom_padding_tokens", "Tokens run in padding steps, all replicas.",
                              value=float(s.padding_tokens))


def _host_tier(s: "EngineStats") -> Iterator[Metric]:
    """The host KV tier (``--host-kv-cache-memory``): prompt tokens it served, bytes moved each way, the
    time steps waited for its copies, and its pool's use."""
    h = s.host
    yield CounterMetricFamily("atom_host_kv_hit_tokens", "Prompt tokens served only thanks to the host KV tier.",
                              value=float(h.host_hit_tokens))
    yield CounterMetricFamily("atom_host_kv_bytes_in", "Bytes restored from the host KV tier into the arena.",
                              value=float(h.host_bytes_in))
    yield CounterMetricFamily("atom_host_kv_bytes_out", "Bytes written back from the arena to the host KV tier.",
                              value=float(h.host_bytes_out))
    yield CounterMetricFamily("atom_host_kv_load_wait_seconds", "Seconds steps waited for host KV copies.",
                              value=h.load_wait_seconds)
    yield GaugeMetricFamily("atom_host_kv_pool_bytes", "Host KV pool bytes lent to an owner (whole chunks).",
                            value=float(h.host_pool_bytes_used))
    yield GaugeMetricFamily("atom_host_kv_pool_capacity_bytes", "Host KV pool size.",
                            value=float(h.host_pool_bytes_total))
    yield GaugeMetricFamily("atom_host_kv_pages", "Host KV pages holding a copy of a prefix block.",
                            value=float(h.host_pages_used))


def _speculative(s: "EngineStats") -> Iterator[Metric]:
    """Mean acceptance length (tokens per verifying request-step) and acceptance per draft position."""
    yield GaugeMetricFamily("atom_spec_decode_mean_acceptance_length",
                            "Tokens a verifying request-step yields on average (accepted drafts + 1); 0 before any.",
                            value=s.spec_mean_acceptance_length)
    per = CounterMetricFamily("atom_spec_decode_num_accepted_tokens_per_pos",
                              "Speculative drafts accepted, by draft position (0 = the first draft).",
                              labels=["position"])
    for i, n in enumerate(s.spec_accepted_at):
        per.add_metric([str(i)], float(n))
    yield per


class ServerMetrics:
    """The registry plus the per-request instruments the routes observe."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._engine = _EngineStatsCollector()
        self.registry.register(self._engine)
        self.ttft = Histogram("atom_time_to_first_token_seconds", "Request arrival to first output token.",
                              buckets=_TTFT_BUCKETS, registry=self.registry)
        self.tpot = Histogram("atom_time_per_output_token_seconds",
                              "Mean time between output tokens of a request (after the first).",
                              buckets=_TPOT_BUCKETS, registry=self.registry)
        self.e2e = Histogram("atom_e2e_request_latency_seconds", "Request arrival to its last token.",
                             buckets=_E2E_BUCKETS, registry=self.registry)
        self.finished = Counter("atom_request_success", "Finished requests by finish reason.",
                                ["finished_reason"], registry=self.registry)
        self.errors = Counter("atom_request_errors", "Requests answered with an error, by HTTP status.",
                              ["status"], registry=self.registry)

    def observe_request(self, arrival: float, first_token: float | None, last_token: float | None,
                        num_output_tokens: int, finish_reason: str | None) -> None:
        """Record one finished choice (times from ``time.perf_counter()``)."""
        if first_token is not None:
            self.ttft.observe(max(first_token - arrival, 0.0))
        if last_token is not None:
            self.e2e.observe(max(last_token - arrival, 0.0))
        if first_token is not None and last_token is not None and num_output_tokens > 1:
            self.tpot.observe(max(last_token - first_token, 0.0) / (num_output_tokens - 1))
        self.finished.labels(finish_reason or "unknown").inc()

    def render(self, stats: "EngineStats | None", healthy: bool) -> bytes:
        """Prometheus text exposition with ``stats`` as the engine snapshot."""
        if stats is not None:
            self._engine.stats = stats
        self._engine.healthy = healthy
        return generate_latest(self.registry)
