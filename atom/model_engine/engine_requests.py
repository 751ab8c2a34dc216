"""The request side of an engine: ids, incremental text, streamed outputs; shared by both engines.

:class:`EngineRequests` turns what a scheduler's step did to its requests into :class:`RequestOutput`
objects: it tracks every request from admission until its final output is streamed, decodes text
incrementally (stop strings held back until decided, :mod:`atom.output.request_text`) and ends a
request whose text reached a stop string. It does not own a scheduler or a runner: every request
remembers the scheduler it was queued on, so the same code serves :class:`~atom.model_engine.llm_engine.LLMEngine`
(one scheduler) and :class:`~atom.model_engine.dp_engine.DataParallelEngine` (one scheduler per
attention replica). Subclasses provide ``add_request``, ``step`` and ``has_unfinished_requests`` and
call the phases here: :meth:`_ended_outputs` before the runner runs, :meth:`_postprocess` after.
"""

from __future__ import annotations

import functools
import itertools
from typing import TYPE_CHECKING, Callable, Sequence as Seq

from atom.model_engine.scheduler import Scheduler
from atom.model_engine.sequence import Sequence, SequenceStatus
from atom.output.request_output import RequestOutput, TokenLogprobs
from atom.output.request_text import RequestText
from atom.sampling_params import SamplingParams
from atom.step_contract import RunnerOutput, ScheduledBatch

if TYPE_CHECKING:
    from atom.tokenizer import Tokenizer

__all__ = ["EngineRequests", "TrackedRequest"]

_FINISH = {SequenceStatus.FINISHED_STOPPED: "stop", SequenceStatus.FINISHED_LENGTH: "length",
           SequenceStatus.FINISHED_ABORTED: "abort"}


class TrackedRequest:
    """One request until its final output: its id, sequence, text and the scheduler it is queued on
    (``replica``: that scheduler's index among the engine's, 0 with one)."""

    __slots__ = ("request_id", "seq", "text", "cached", "sched", "replica")

    def __init__(self, request_id: str, seq: Sequence, text: RequestText | None, sched: Scheduler,
                 replica: int = 0) -> None:
        self.request_id, self.seq, self.text, self.cached = request_id, seq, text, 0
        self.sched, self.replica = sched, replica


class EngineRequests:
    """Request bookkeeping and output building over one or more schedulers (see the module docstring)."""

    def __init__(self, tokenizer: Tokenizer | None, model_name: str, max_model_len: int) -> None:
        self.tokenizer = tokenizer
        self.model_name = model_name
        self.max_model_len = max_model_len
        self._requests: dict[str, TrackedRequest] = {}
        self._by_seq: dict[int, TrackedRequest] = {}
        self._ids = itertools.count()
        self._generation_tokens = 0

    # ---- to implement -------------------------------------------------------------------------
    def add_request(self, prompt: str | Seq[int], params: SamplingParams, request_id: str | None = None) -> str:
        raise NotImplementedError

    def step(self) -> list[RequestOutput]:
        raise NotImplementedError

    def has_unfinished_requests(self) -> bool:
        raise NotImplementedError

    # ---- requests -----------------------------------------------------------------------------
    def _prompt_ids(self, prompt: str | Seq[int]) -> list[int]:
        """The token ids of a prompt (text is encoded); ``ValueError`` when there are none."""
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("this engine has no tokenizer: pass prompt token ids")
            ids = self.tokenizer.encode(prompt)
        else:
            ids = [int(t) for t in prompt]
        if not ids:
            raise ValueError("the prompt is empty")
        return ids

    def _check_free(self, request_id: str | None) -> str:
        """``request_id``, or a fresh id when it is None; ``ValueError`` if it is in use."""
        rid = request_id if request_id is not None else f"req-{next(self._ids)}"
        if rid in self._requests:
            raise ValueError(f"request id {rid!r} is already in use")
        return rid

    def _track(self, seq: Sequence, rid: str, sched: Scheduler, replica: int = 0) -> str:
        """Queue ``seq`` on ``sched`` (``ValueError`` from the scheduler when it can never run) and track it."""
        sched.add(seq)
        params = seq.params
        text = None if self.tokenizer is None else RequestText(
            functools.partial(self.tokenizer.decode, skip_special_tokens=params.skip_special_tokens), params.stop,
            params.include_stop_str_in_output)
        req = TrackedRequest(rid, seq, text, sched, replica)
        self._requests[rid] = req
        self._by_seq[seq.seq_id] = req
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
        return req is not None and req.sched.abort(req.seq.seq_id)

    # ---- step phases --------------------------------------------------------------------------
    def _ended_outputs(self, sched: Scheduler) -> list[RequestOutput]:
        """Final outputs of the requests of ``sched`` aborted or refused at admission since the last
        call: O(finished), not a scan of every request."""
        ended = (self._by_seq.get(seq.seq_id) for seq in sched.take_ended())
        return [self._finish_output(req) for req in ended if req is not None]

    def _postprocess(self, sched: Scheduler, batch: ScheduledBatch, out: RunnerOutput, outputs: list[RequestOutput],
                     launch_next: Callable[[], None] | None = None) -> list[RequestOutput]:
        """``outputs`` extended by the outputs of the requests ``batch`` (of ``sched``) advanced, in batch
        order. ``launch_next`` (overlapped steps) is called once the requests whose text can still end them
        (stop strings) have theirs; the other requests' text is decoded while the next step runs."""
        results = sched.postprocess(batch, out)
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

    def _result_output(self, req: TrackedRequest, new_tokens: list[int], out: RunnerOutput) -> RequestOutput:
        self._generation_tokens += len(new_tokens)
        return self._output(req, new_tokens, out.logprobs.get(req.seq.seq_id))

    def _output(self, req: TrackedRequest, new_tokens: list[int], logprobs: TokenLogprobs | None) -> RequestOutput:
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
                piece, stopped = req.text.advance(None if last and self._is_stop_token(req, token) else token,
                                                  last and seq.status.finished)
                pieces.append(piece)
            new_text = "".join(pieces)
            if stopped:
                req.sched.finish_by_stop_string(seq)
        if seq.status.finished:
            self._forget(req)
        result = self._make(req, new_ids, new_text)
        if logprobs is not None:
            result.new_logprobs.append(logprobs)
        return result

    @staticmethod
    def _is_stop_token(req: TrackedRequest, token: int | None) -> bool:
        """The token that ended the request (end-of-sequence or a stop token id) is not part of the text;
        a stop token id is when the request keeps what stopped it (``include_stop_str_in_output``). The
        end-of-sequence token never is: a chat whose markers are kept for the answer parser would
        otherwise show it in the answer."""
        seq = req.seq
        if token is None or seq.status is not SequenceStatus.FINISHED_STOPPED:
            return False
        p = seq.params
        if token == req.sched.eos_token_id and not p.ignore_eos:
            return True
        return token in p.stop_token_ids and not p.include_stop_str_in_output

    def _finish_output(self, req: TrackedRequest) -> RequestOutput:
        self._forget(req)
        return self._make(req, [], "")

    @staticmethod
    def _make(req: TrackedRequest, new_ids: list[int], new_text: str) -> RequestOutput:
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

    def _forget(self, req: TrackedRequest) -> None:
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


def _progress(total: int, enabled: bool):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, desc="generate", unit="req")
