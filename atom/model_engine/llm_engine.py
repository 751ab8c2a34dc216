"""LLMEngine: requests in, streamed outputs out; the scheduler loop around a runner.

The engine itself is pure Python: it owns the :class:`Scheduler` (and through it the block manager
and arena bookkeeping), turns text into token ids and back (incrementally, with stop strings held
back until they are decided: :mod:`request_text`), and calls a runner
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

import functools
import itertools
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Callable, Protocol, Sequence as Seq

from atom.step_contract import ReadyOutput, RunnerOutput, ScheduledBatch
from atom.output.request_text import RequestText
from atom.output.request_output import EngineStats, RequestOutput, TokenLogprobs
from atom.model_engine.scheduler import Scheduler
from atom.model_engine.sequence import Sequence, SequenceStatus
from atom.sampling_params import SamplingParams

if TYPE_CHECKING:
    from atom.tokenizer import Tokenizer

__all__ = ["LLMEngine", "EngineStep", "Runner", "LLM"]

_FINISH = {SequenceStatus.FINISHED_STOPPED: "stop", SequenceStatus.FINISHED_LENGTH: "length",
           SequenceStatus.FINISHED_ABORTED: "abort"}


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


class _Request:
    __slots__ = ("request_id", "seq", "text", "cached")

    def __init__(self, request_id: str, seq: Sequence, text: RequestText | None) -> None:
        self.request_id, self.seq, self.text, self.cached = request_id, seq, text, 0


class LLMEngine:
    """Continuous batching over one scheduler and one runner."""

    def __init__(self, scheduler: Scheduler, runner: Runner, tokenizer: Tokenizer | None = None,
                 model_name: str = "atom", max_model_len: int | None = None) -> None:
        self.scheduler = scheduler
        self.runner = runner
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.max_model_len = max_model_len or scheduler.config.max_model_len
        self._requests: dict[str, _Request] = {}
        self._by_seq: dict[int, _Request] = {}
        self._ids = itertools.count()
        self._generation_tokens = 0
        # drafts are proposed from the previous step's output, so speculative steps never overlap
        self.overlap = scheduler.config.overlap and not scheduler.config.speculative_num_tokens
        self._inflight: tuple[ScheduledBatch, PendingOutput] | None = None

    # ---- requests -----------------------------------------------------------------------------
    def add_request(self, prompt: str | Seq[int], params: SamplingParams, request_id: str | None = None) -> str:
        """Queue a request; ``ValueError`` (with the numbers) if it can never run."""
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this engine has no tokenizer: pass prompt token ids")
            ids = self.tokenizer.encode(prompt)
        else:
            ids = [int(t) for t in prompt]
        if not ids:
            raise ValueError("the prompt is empty")
        rid = self._check_free(request_id)  # before the Sequence: a refused id leaves nothing behind
        return self.add_sequence(Sequence(ids, params, self.scheduler.block_size), rid)

    def add_sequence(self, seq: Sequence, request_id: str | None = None) -> str:
        """Queue a request already made into a :class:`Sequence` (for callers that choose its id or
        arrival time, like the simulator); ``ValueError`` as :meth:`add_request`."""
        rid = self._check_free(request_id)
        self.scheduler.add(seq)
        params = seq.params
        text = None if self.tokenizer is None else RequestText(
            functools.partial(self.tokenizer.decode, skip_special_tokens=params.skip_special_tokens), params.stop,
            params.include_stop_str_in_output)
        req = _Request(rid, seq, text)
        self._requests[rid] = req
        self._by_seq[seq.seq_id] = req
        return rid

    def _check_free(self, request_id: str | None) -> str:
        """``request_id``, or a fresh id when it is None; ``ValueError`` if it is in use."""
        rid = request_id if request_id is not None else f"req-{next(self._ids)}"
        if rid in self._requests:
            raise ValueError(f"request id {rid!r} is already in use")
        return rid

    def sequence(self, request_id: str) -> Sequence:
        """The scheduler's :class:`Sequence` of a request whose final output has not been streamed yet
        (tests and benchmarks read its progress, tokens and prefix statistics from it); ``KeyError``
        if unknown or done."""
        return self._requests[request_id].seq

    def abort_request(self, request_id: str) -> bool:
        """Stop a request and free what it holds now; its final output (``finish_reason`` "abort")
        comes with the next step. False if it is unknown or already finished."""
        req = self._requests.get(request_id)
        return req is not None and self.scheduler.abort(req.seq.seq_id)

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
        outputs = self._ended_outputs()
        out = self.runner.execute(batch)  # even with no sequence: releases and table deltas must land
        return EngineStep(batch, out, self._postprocess(batch, out, outputs))

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
        outputs = self._ended_outputs()
        out = pending.result()

        def launch_next() -> None:
            nonlocal ahead
            ahead = self.scheduler.complete_ahead(ahead)
            if ahead.seqs:
                self._inflight = (ahead, self._launch(ahead))
            else:
                self.runner.execute(ahead)  # releases and table deltas must land

        return EngineStep(batch, out, self._postprocess(batch, out, outputs, launch_next))

    def _launch(self, batch: ScheduledBatch) -> PendingOutput:
        launch = getattr(self.runner, "launch", None)
        return launch(batch) if launch is not None else ReadyOutput(self.runner.execute(batch))

    def _ended_outputs(self) -> list[RequestOutput]:
        """Final outputs of the requests aborted or refused at admission since the last call:
        O(finished), not a scan of every request."""
        ended = (self._by_seq.get(seq.seq_id) for seq in self.scheduler.take_ended())
        return [self._finish_output(req) for req in ended if req is not None]

    def _postprocess(self, batch: ScheduledBatch, out: RunnerOutput, outputs: list[RequestOutput],
                     launch_next: Callable[[], None] | None = None) -> list[RequestOutput]:
        """``outputs`` extended by the outputs of the requests ``batch`` advanced, in batch order.
        ``launch_next`` (overlapped steps) is called once the requests whose text can still end them
        (stop strings) have theirs; the other requests' text is decoded while the next step runs."""
        results = self.scheduler.postprocess(batch, out)
        reqs = [self._by_seq.get(res.seq.seq_id) for res in results]
        built: list[RequestOutput | None] = [None] * len(results)
        if launch_next is not None:
            for i, (res, req) in enumerate(zip(results, reqs)):
                if req is not None and req.text is not None and req.seq.params.stop and not res.finished:
                    built[i] = self._result_output(req, res.new_tokens, out)
            launch_next()
        for i, (res, req) in enumerate(zip(results, reqs)):
            if req is not None and built[i] is None:
                built[i] = self._result_output(req, res.new_tokens, out)
        outputs.extend(o for o in built if o is not None)
        return outputs

    def _result_output(self, req: _Request, new_tokens: list[int], out: RunnerOutput) -> RequestOutput:
        self._generation_tokens += len(new_tokens)
        return self._output(req, new_tokens, out.logprobs.get(req.seq.seq_id))

    def _output(self, req: _Request, new_tokens: list[int], logprobs: TokenLogprobs | None) -> RequestOutput:
        """``new_tokens``: this step's tokens (several when drafts were accepted; such requests have no
        stop strings, see :meth:`Scheduler._propose`)."""
        seq = req.seq
        req.cached = seq.stats.reused  # set at first admission only
        new_ids = list(new_tokens)
        new_text = ""
        if req.text is not None:
            pieces = []
            for i, token in enumerate(new_tokens or [None]):
                last = i == max(len(new_tokens), 1) - 1
                piece, stopped = req.text.advance(None if last and self._is_stop_token(seq, token) else token,
                                                  last and seq.status.finished)
                pieces.append(piece)
            new_text = "".join(pieces)
            if stopped:
                self.scheduler.finish_by_stop_string(seq)
        if seq.status.finished:
            self._forget(req)
        result = self._make(req, new_ids, new_text)
        if logprobs is not None:
            result.new_logprobs.append(logprobs)
        return result

    def _is_stop_token(self, seq: Sequence, token: int | None) -> bool:
        """The token that ended the request (end-of-sequence or a stop token id) is not part of the text;
        a stop token id is when the request keeps what stopped it (``include_stop_str_in_output``). The
        end-of-sequence token never is: a chat whose markers are kept for the answer parser would
        otherwise show it in the answer."""
        if token is None or seq.status is not SequenceStatus.FINISHED_STOPPED:
            return False
        p = seq.params
        if token == self.scheduler.eos_token_id and not p.ignore_eos:
            return True
        return token in p.stop_token_ids and not p.include_stop_str_in_output

    def _finish_output(self, req: _Request) -> RequestOutput:
        self._forget(req)
        return self._make(req, [], "")

    def _make(self, req: _Request, new_ids: list[int], new_text: str) -> RequestOutput:
        seq = req.seq
        if not seq.status.finished:  # cumulative fields only at the end: O(1) per step, not O(length)
            return RequestOutput(req.request_id, [], [], new_ids, "", new_text, False, None, req.cached,
                                 seq.stats, seq.error, seq.num_output_tokens)
        text = req.text.text() if req.text is not None else ""
        # a stop string completed by the text released at the end (e.g. at max_tokens) still counts
        reason = "stop" if req.text is not None and req.text.stopped else _FINISH.get(seq.status)
        return RequestOutput(req.request_id, seq.token_ids[: seq.num_prompt_tokens], list(seq.output_token_ids),
                             new_ids, text, new_text, True, reason, req.cached, seq.stats, seq.error,
                             seq.num_output_tokens)

    def _forget(self, req: _Request) -> None:
        self._requests.pop(req.request_id, None)
        self._by_seq.pop(req.seq.seq_id, None)

    # ---- offline ------------------------------------------------------------------------------
    def generate(self, prompts: Seq[str] | Seq[Seq[int]], params: SamplingParams | Seq[SamplingParams],
                 use_tqdm: bool = True) -> list[RequestOutput]:
        """Run a batch of prompts to completion; outputs in prompt order. Shows progress with tqdm."""
        plist = list(params) if isinstance(params, (list, tuple)) else [params] * len(prompts)
        if len(plist) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(plist)} sampling params")
        ids = [self.add_request(p, sp) for p, sp in zip(prompts, plist)]
        wanted = set(ids)
        final: dict[str, RequestOutput] = {}
        bar = _progress(len(ids), use_tqdm)
        while len(final) < len(ids) and self.has_unfinished_requests():
            for out in self.step():
                if out.finished and out.request_id in wanted and out.request_id not in final:
                    final[out.request_id] = out
                    if bar is not None:
                        bar.update(1)
        if bar is not None:
            bar.close()
        return [final[i] for i in ids]

    # ---- observability ------------------------------------------------------------------------
    def stats(self) -> EngineStats:
        s, c, sp = self.scheduler, self.scheduler.bm.counters, self.scheduler.spec
        return EngineStats(s.bm.arena.usage(), len(s.running), len(s.waiting), s.num_preemptions, replace(c),
                           self._generation_tokens, sp.verifies, sp.proposed, sp.accepted,
                           tuple(sp.proposed_at), tuple(sp.accepted_at))

    def check_integrity(self) -> None:
        self.scheduler.check_integrity()


def _progress(total: int, enabled: bool):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc="generate", unit="req")


LLM = LLMEngine
