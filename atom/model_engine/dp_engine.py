"""DataParallelEngine: continuous batching over D attention replicas, each with its own scheduler and arena.

Under data-parallel attention (``--data-parallel-size D``) every replica owns its requests and its KV
arena: one :class:`Scheduler` over its own :class:`~atom.kv.block_manager.BlockManager` per replica, all
on rank 0 (pure Python). One runner steps every replica at once (``execute_all``: the expert layers'
collectives need every rank of every replica in each step). This engine is the control plane in front
of them; it has the public API the server uses from :class:`~atom.model_engine.llm_engine.LLMEngine`
(``add_request``, ``abort_request``, ``step`` / ``step_detailed``, ``has_unfinished_requests``,
``stats``, ``check_integrity``, ``generate``, ``tokenizer``, ``model_name``, ``max_model_len``) and the
same request side (:class:`~atom.model_engine.engine_requests.EngineRequests`: text, stop strings,
aborts and final outputs work the same whichever replica holds a request).

Placement. A new request goes where the :class:`~atom.model_engine.router.ReplicaRouter` sends it
(default policy ``prefix``: the most cached prefix tokens of the prompt less the replica's running
and queued tokens, ties to the most free arena, then the fewest waiting tokens; sticky per
``session``, the OpenAI ``user`` field; the rule and its reasons are in :mod:`atom.model_engine.router`). ``place_with`` puts a request on the replica of an earlier one: the ``n`` choices of one HTTP
request share their prompt, so they go to one replica and share its prefix cache.

Each step:

1. every replica's scheduler schedules (a replica with nothing to run gives an empty batch);
2. the final outputs of requests aborted or refused since the last step are collected;
3. ``runner.execute_all(batches)`` with ``batches[d]`` None for a replica with nothing to run (it runs
   a padding step, counted here per replica); no runner call at all when every replica is idle. A
   replica's empty batch may still carry releases, page-table deltas or page copies: they are kept and
   shipped, in the order they were emitted, with that replica's next batch that runs (whose releases
   the runner applies first), so a batch handed to the runner always has at least one sequence;
4. each replica that ran postprocesses its output, in replica order.

Steps never overlap here (``SchedulerConfig.overlap`` is not used): the runner's ``execute_all`` runs
every replica's step to completion before it returns.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import TYPE_CHECKING, Protocol, Sequence as Seq

from atom.config import EngineConfig
from atom.kv.prefix_stats import PrefixStats
from atom.model_engine.engine_requests import EngineRequests
from atom.model_engine.router import ReplicaRouter, SchedulerView
from atom.model_engine.scheduler import Scheduler
from atom.model_engine.sequence import Sequence
from atom.output.request_output import EngineStats, ReplicaStats, RequestOutput
from atom.sampling_params import SamplingParams
from atom.step_contract import RunnerOutput, ScheduledBatch

if TYPE_CHECKING:
    from atom.tokenizer import Tokenizer

__all__ = ["DataParallelEngine", "DataParallelStep", "ReplicaRunner", "PADDING_TOKENS_PER_STEP",
           "check_data_parallel_config"]

PADDING_TOKENS_PER_STEP = 1
"""Tokens a replica runs in a padding step (one dummy token that touches no KV page)."""


class ReplicaRunner(Protocol):
    """The runner of every replica at once (``atom.parallel.dp_runner.DataParallelRunner``, or
    :class:`atom.testing.replica_runners.ReplicaRunners` in tests)."""

    replicas: int
    padding_steps: int
    padding_tokens: int

    def execute_all(self, batches: Seq[ScheduledBatch | None]) -> list[RunnerOutput | None]: ...


@dataclass(frozen=True, slots=True)
class DataParallelStep:
    """One step seen whole: what each replica was given (``None``: nothing to run, a padding step when
    ``ran``), what the runner returned for it (``None`` where it ran nothing), whether the runner was
    called at all, and the outputs :meth:`DataParallelEngine.step` streams."""

    batches: tuple[ScheduledBatch | None, ...]
    runner_outputs: tuple[RunnerOutput | None, ...]
    ran: bool
    outputs: list[RequestOutput]


class DataParallelEngine(EngineRequests):
    """Continuous batching over one scheduler per attention replica and one runner of them all."""

    def __init__(self, schedulers: Seq[Scheduler], runner: ReplicaRunner, tokenizer: Tokenizer | None = None,
                 router: ReplicaRouter | None = None, model_name: str = "atom",
                 max_model_len: int | None = None) -> None:
        if not schedulers:
            raise ValueError("a data-parallel engine needs at least one scheduler")
        first = schedulers[0]
        for d, s in enumerate(schedulers):
            if (s.block_size, s.config, s.eos_token_id) != (first.block_size, first.config, first.eos_token_id):
                raise ValueError(f"replica {d}'s scheduler differs from replica 0's (block size, scheduler "
                                 "config or end-of-sequence token): every replica must serve the same way")
        if runner.replicas != len(schedulers):
            raise ValueError(f"the runner steps {runner.replicas} replicas but {len(schedulers)} schedulers were given")
        super().__init__(tokenizer, model_name, max_model_len or first.config.max_model_len)
        self.schedulers = list(schedulers)
        self.runner = runner
        self.router = router if router is not None else ReplicaRouter("prefix")
        self._views = [SchedulerView(s) for s in self.schedulers]
        self._carry: list[ScheduledBatch | None] = [None] * len(self.schedulers)
        self._padding_steps = [0] * len(self.schedulers)

    @property
    def replicas(self) -> int:
        return len(self.schedulers)

    # ---- requests -----------------------------------------------------------------------------
    def add_request(self, prompt: str | Seq[int], params: SamplingParams, request_id: str | None = None, *,
                    session: str | None = None, place_with: str | None = None) -> str:
        """Queue a request on the replica the router picks; ``ValueError`` (with the numbers) if it can
        never run. ``session`` (the OpenAI ``user`` field): the router sends a session back to the
        replica it chose first. ``place_with``: the id of a request still tracked here whose replica
        this one joins (the other choices of an ``n > 1`` request); routed as usual if it is gone."""
        ids = self._prompt_ids(prompt)
        rid = self._check_free(request_id)
        replica = self._place(ids, session, place_with)
        return self._track(Sequence(ids, params, self.schedulers[replica].block_size), rid,
                           self.schedulers[replica], replica)

    def add_sequence(self, seq: Sequence, request_id: str | None = None, *, replica: int | None = None,
                     session: str | None = None) -> str:
        """Queue a request already made into a :class:`Sequence`, on ``replica`` (None: the router's
        choice); ``ValueError`` as :meth:`add_request` or for a replica index out of range."""
        rid = self._check_free(request_id)
        if replica is None:
            replica = self.router.route(seq.token_ids, self._views, session)
        elif not 0 <= replica < self.replicas:
            raise ValueError(f"replica={replica} is not one of the {self.replicas} replicas (0..{self.replicas - 1})")
        return self._track(seq, rid, self.schedulers[replica], replica)

    def _place(self, ids: list[int], session: str | None, place_with: str | None) -> int:
        if place_with is not None:
            other = self._requests.get(place_with)
            if other is not None:
                return other.replica
        return self.router.route(ids, self._views, session)

    def replica_of(self, request_id: str) -> int:
        """The replica a request still tracked here runs on; ``KeyError`` if unknown or done."""
        return self._requests[request_id].replica

    def has_unfinished_requests(self) -> bool:
        """Whether a step has anything to do on any replica (as :meth:`LLMEngine.has_unfinished_requests`)."""
        return any(s.has_unfinished() or s.has_ended() for s in self.schedulers)

    # ---- stepping -----------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Schedule every replica, run them together, postprocess each; the outputs of the requests that
        progressed and the final output of each request aborted or refused since the last step."""
        return self.step_detailed().outputs

    def step_detailed(self) -> DataParallelStep:
        """:meth:`step`, also returning each replica's batch and runner output."""
        batches = tuple(self._runnable(d, s.schedule()) for d, s in enumerate(self.schedulers))
        outputs: list[RequestOutput] = []
        for s in self.schedulers:
            outputs += self._ended_outputs(s)
        if all(b is None for b in batches):
            return DataParallelStep(batches, (None,) * self.replicas, False, outputs)
        for d, b in enumerate(batches):
            if b is None:
                self._padding_steps[d] += 1
        outs = tuple(self.runner.execute_all(batches))
        if len(outs) != self.replicas:
            raise RuntimeError(f"the runner returned {len(outs)} outputs for {self.replicas} replicas")
        for s, b, out in zip(self.schedulers, batches, outs):
            if b is not None:
                if out is None:
                    raise RuntimeError(f"the runner returned no output for a batch of step {b.step_id}")
                self._postprocess(s, b, out, outputs)
        return DataParallelStep(batches, outs, True, outputs)

    def _runnable(self, d: int, batch: ScheduledBatch) -> ScheduledBatch | None:
        """``batch`` (with the deltas replica ``d`` kept from earlier empty batches) if it runs a sequence;
        else None, its releases and deltas kept for the replica's next batch that runs."""
        merged = _merge(self._carry[d], batch)
        if batch.seqs:
            self._carry[d] = None
            return merged
        self._carry[d] = merged if _deltas(merged) else None
        return None

    # ---- observability ------------------------------------------------------------------------
    def replica_stats(self) -> tuple[ReplicaStats, ...]:
        """Each replica's arena use, queue, prefix-cache hits, preemptions and padding."""
        return tuple(ReplicaStats(s.bm.arena.usage(), len(s.running), len(s.waiting), s.bm.counters.prompt_tokens,
                                  s.bm.counters.reused, s.num_preemptions, steps, steps * PADDING_TOKENS_PER_STEP)
                     for s, steps in zip(self.schedulers, self._padding_steps))

    def stats(self) -> EngineStats:
        """Sums over the replicas (arena bytes per owner, queues, preemptions, prefix statistics), each
        replica's own (:meth:`replica_stats`) and the runner's padding totals."""
        arena: dict[str, int] = {}
        prefix = PrefixStats()
        for s in self.schedulers:
            for owner, nbytes in s.bm.arena.usage().items():
                arena[owner] = arena.get(owner, 0) + nbytes
            prefix.add(s.bm.counters)
        return EngineStats(arena, sum(len(s.running) for s in self.schedulers),
                           sum(len(s.waiting) for s in self.schedulers),
                           sum(s.num_preemptions for s in self.schedulers), prefix, self._generation_tokens,
                           replicas=self.replica_stats(), padding_steps=self.runner.padding_steps,
                           padding_tokens=self.runner.padding_tokens)

    def check_integrity(self) -> None:
        for s in self.schedulers:
            s.check_integrity()


_STEP_FIELDS = ("step", "seqs")  # what a batch runs; every other field of a batch is a tuple of deltas


def _deltas(batch: ScheduledBatch) -> list[str]:
    """The names of ``batch``'s delta fields (releases, table deltas, page copies) that are not empty."""
    return [f.name for f in fields(batch) if f.name not in _STEP_FIELDS and getattr(batch, f.name)]


def _merge(kept: ScheduledBatch | None, batch: ScheduledBatch) -> ScheduledBatch:
    """``batch`` preceded by the deltas of ``kept`` (an earlier batch without sequences): each delta
    field is ``kept``'s then ``batch``'s, in the order the scheduler emitted them; a kept table update of
    a request ``batch`` releases is dropped (moot, as in the scheduler)."""
    if kept is None:
        return batch
    gone = set(batch.released_ids)
    merged = {name: getattr(kept, name) + getattr(batch, name) for name in _deltas(kept)}
    merged["table_updates"] = tuple(u for u in kept.table_updates if u.seq_id not in gone) + batch.table_updates
    return replace(batch, **merged)


def check_data_parallel_config(config: EngineConfig) -> None:
    """``ValueError`` naming the flags for what ``--data-parallel-size`` > 1 does not support."""
    par = config.parallel
    d = par.data_parallel_size
    if d == 1:
        return
    if config.scheduler.speculative_num_tokens:
        raise ValueError(f"--speculative-num-tokens {config.scheduler.speculative_num_tokens} needs "
                         f"--data-parallel-size 1 (got {d}): the MTP block is not served across ranks")
    if config.cache.gpu_memory_utilization is not None:
        raise ValueError(f"--gpu-memory-utilization profiles one GPU's memory; with --data-parallel-size {d} "
                         "size each replica's arena with --kv-cache-memory (per rank)")
    if par.distributed_executor_backend != "mp":
        raise ValueError(f"--data-parallel-size {d} runs with --distributed-executor-backend mp (atom serve "
                         f"starts every rank on this machine); {par.distributed_executor_backend} is not "
                         "supported with data parallelism yet")
