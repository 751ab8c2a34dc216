"""LLMEngine: requests in, streamed outputs out; the scheduler loop around a runner.

The engine itself is pure Python: it owns the :class:`Scheduler` (and through it the block manager
and arena bookkeeping), turns text into token ids and back (incrementally, with stop strings held
back until they are decided; this request side is :class:`~atom.model_engine.engine_requests.EngineRequests`,
shared with the data-parallel engine), and calls a runner
with one frozen batch per step. Any object with ``execute(ScheduledBatch) -> RunnerOutput`` is a
runner: the torch :class:`atom.model_executor.model_runner.ModelRunner` in production,
:class:`atom.testing.fake_runner.FakeRunner` in control-plane tests, benchmarks and the simulator.
:func:`atom.engine_builder.build_engine` builds the real one (importing torch).

:meth:`LLMEngine.step` is the one step loop (schedule -> execute -> postprocess) of the code base;
with ``overlap`` (the default, ``SchedulerConfig.overlap``) it schedules the next step while the
runner's step runs: a runner with ``launch(batch)`` returns a handle whose ``result()`` waits for the
step's sampled tokens (on a GPU an event after a non-blocking copy); a runner without it is wrapped
(``execute`` at launch), which keeps the same order of scheduler operations.
callers that need to see inside a step (the batch the scheduler froze, the runner's output and, from
a runner that keeps them, every row's logits) call :meth:`LLMEngine.step_detailed`, which is the
same step. Not thread-safe: one thread drives it (the server runs it in a background loop).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable, Protocol, Sequence as Seq

from atom.kv.host_pool import HostTierStats
from atom.model_engine.engine_requests import EngineRequests
from atom.model_engine.scheduler import Scheduler
from atom.model_engine.sequence import Sequence
from atom.output.request_output import EngineStats, RequestOutput
from atom.sampling_params import SamplingParams
from atom.step_contract import ReadyOutput, RunnerOutput, ScheduledBatch

if TYPE_CHECKING:
    from atom.tokenizer import Tokenizer

__all__ = ["LLMEngine", "EngineStep", "Runner", "LLM"]


class Runner(Protocol):
    def execute(self, batch: ScheduledBatch) -> RunnerOutput: ...


class PendingOutput(Protocol):
    """A launched step: :meth:`result` waits for it and returns its output (once)."""

    def result(self) -> RunnerOutput: ...


@dataclass(frozen=True, slots=True)
class EngineStep:
    """One step seen whole: the frozen batch, what the runner returned for it (``output.logits`` is
    filled only by a runner that keeps logits), and the outputs :meth:`LLMEngine.step` streams."""

    batch: ScheduledBatch
    output: RunnerOutput
    outputs: list[RequestOutput]


class LLMEngine(EngineRequests):
    """Continuous batching over one scheduler and one runner."""

    def __init__(self, scheduler: Scheduler, runner: Runner, tokenizer: Tokenizer | None = None,
                 model_name: str = "atom", max_model_len: int | None = None) -> None:
        super().__init__(tokenizer, model_name, max_model_len or scheduler.config.max_model_len)
        self.scheduler = scheduler
        self.runner = runner
        # drafts are proposed from the previous step's output, so speculative steps never overlap
        self.overlap = scheduler.config.overlap and not scheduler.config.speculative_num_tokens
        self._inflight: tuple[ScheduledBatch, PendingOutput] | None = None

    # ---- requests -----------------------------------------------------------------------------
    def add_request(self, prompt: str | Seq[int], params: SamplingParams, request_id: str | None = None, *,
                    session: str | None = None, place_with: str | None = None) -> str:
        """Queue a request; ``ValueError`` (with the numbers) if it can never run. ``session`` and
        ``place_with`` choose an attention replica under data parallelism
        (:meth:`DataParallelEngine.add_request`); with one scheduler they have no effect."""
        ids = self._prompt_ids(prompt)
        rid = self._check_free(request_id)  # before the Sequence: a refused id leaves nothing behind
        return self.add_sequence(Sequence(ids, params, self.scheduler.block_size), rid)

    def add_sequence(self, seq: Sequence, request_id: str | None = None) -> str:
        """Queue a request already made into a :class:`Sequence` (for callers that choose its id or
        arrival time, like the simulator); ``ValueError`` as :meth:`add_request`."""
        return self._track(seq, self._check_free(request_id), self.scheduler)

    def has_unfinished_requests(self) -> bool:
        """Whether a step has anything to do: a request waits or runs, or a request finished outside
        a step (aborted) still has its final output to stream."""
        return self.scheduler.has_unfinished() or self.scheduler.has_ended() or self._inflight is not None

    # ---- stepping -----------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """Schedule, run and postprocess one step; outputs of the requests that progressed, and the
        final output of each request aborted or refused at admission since the last step."""
        return self.step_detailed().outputs

    def step_detailed(self) -> EngineStep:
        """:meth:`step`, also returning the batch and the runner's output."""
        if self.overlap:
            return self._overlapped_step()
        batch = self.scheduler.schedule()
        outputs = self._ended_outputs(self.scheduler)
        out = self.runner.execute(batch)  # even with no sequence: releases and table deltas must land
        return EngineStep(batch, out, self._postprocess(self.scheduler, batch, out, outputs))

    def _overlapped_step(self) -> EngineStep:
        """Step N (launched by the previous call, or now when none runs) is finished and streamed;
        step N+1 is scheduled while N runs and launched once N's tokens are applied, so the next call
        finds it running. Same outputs as the sequential step: N+1 drops the requests N ended, takes
        N's tokens in place of its placeholders, and leaves out the requests N certainly finishes."""
        if self._inflight is None:
            batch = self.scheduler.schedule()
            self._inflight = (batch, self._launch(batch))
        batch, pending = self._inflight
        self._inflight = None
        ahead = self.scheduler.schedule_ahead(batch)  # runs while the runner's step does
        outputs = self._ended_outputs(self.scheduler)
        out = pending.result()

        def launch_next() -> None:
            nonlocal ahead
            ahead = self.scheduler.complete_ahead(ahead)
            if ahead.seqs:
                self._inflight = (ahead, self._launch(ahead))
            else:
                self.runner.execute(ahead)  # releases and table deltas must land

        return EngineStep(batch, out, self._postprocess(self.scheduler, batch, out, outputs, launch_next))

    def _launch(self, batch: ScheduledBatch) -> PendingOutput:
        launch = getattr(self.runner, "launch", None)
        return launch(batch) if launch is not None else ReadyOutput(self.runner.execute(batch))

    # ---- observability ------------------------------------------------------------------------
    def stats(self) -> EngineStats:
        s, c, sp = self.scheduler, self.scheduler.bm.counters, self.scheduler.spec
        return EngineStats(s.bm.arena.usage(), len(s.running), len(s.waiting), s.num_preemptions, replace(c),
                           self._generation_tokens, sp.verifies, sp.proposed, sp.accepted,
                           tuple(sp.proposed_at), tuple(sp.accepted_at), host=self._host_stats())

    def _host_stats(self) -> HostTierStats | None:
        """The host tier's totals, with the time the runner's steps waited for its copies."""
        host = self.scheduler.bm.host
        if host is None:
            return None
        out = host.snapshot()
        copies = getattr(self.runner, "host_copies", None)
        out.load_wait_seconds = copies.wait_seconds if copies is not None else 0.0
        return out

    def check_integrity(self) -> None:
        self.scheduler.check_integrity()


LLM = LLMEngine
