"""Engine-neutral operation traces for comparing KV-cache managers step by step.

A trace is the list of steps a simple scheduler would run over one workload, written without
reference to any cache: each step lists operations on request indices, in the order an engine
performs them:

- ``("decode", i, 1)``: request ``i`` (prompt done) runs one token;
- ``("chunk", i, n)``: request ``i`` runs up to ``n`` more prompt tokens (its prefill continues);
- ``("admit", i, n)``: request ``i`` is admitted with a first step of up to ``n`` tokens;
- ``("free", i, 0)``: request ``i`` has finished and releases its KV (after the step).

Each step decodes every request past its prompt, then spends a prefill budget of ``CHUNK`` tokens on
the request being prefilled and then on admissions, in arrival order. A request decodes
``decode_steps`` tokens after its prompt, then is freed. The trace assumes no prefix hits; an engine
that hits runs fewer prompt tokens and skips the ``chunk`` operations it no longer needs, so every
engine replays the same operations against its own cache. :func:`replay` drives a
:class:`ReplayEngine` through the trace and times either each operation (wall clock, less the
clock's own cost) or whole steps (this process's CPU time), not both in one replay: readings inside
a step would add their own cost to it.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Iterator, Protocol

__all__ = ["CHUNK", "Trace", "TRACES", "Op", "build_steps", "prompt_tokens", "ReplayEngine", "RunRecord", "clock_cost_ns", "replay"]

CHUNK = 8192  # prefill tokens per step

Op = tuple[str, int, int]


@dataclass(frozen=True)
class Trace:
    """A workload: ``num_seqs`` prompts of ``context`` tokens whose first ``shared`` tokens are common."""

    name: str
    num_seqs: int
    context: int
    shared: int = 0


TRACES = (Trace("decode-heavy", 256, 4096), Trace("long-context", 32, 131072),
          Trace("shared-prefix", 64, 4096 + 512, shared=4096))


def prompt_tokens(trace: Trace, i: int) -> list[int]:
    """Request ``i``'s prompt: the shared part, then tokens of its own (small ints, token ids < 50,001)."""
    own = [(i * 7919 + j * 31) % 50000 + 1 for j in range(trace.context - trace.shared)]
    return [(j * 13) % 50000 + 1 for j in range(trace.shared)] + own


def build_steps(trace: Trace, decode_steps: int, chunk: int = CHUNK) -> list[list[Op]]:
    """The trace's steps (see the module docstring). ``decode_steps`` >= 1, ``chunk`` >= 1."""
    if decode_steps < 1 or chunk < 1:
        raise ValueError(f"decode_steps ({decode_steps}) and chunk ({chunk}) must be at least 1")
    waiting = deque(range(trace.num_seqs))
    prefilling: deque[list[int]] = deque()  # [request, prompt tokens run so far]
    decoding: dict[int, int] = {}  # request -> decode steps left
    steps: list[list[Op]] = []
    while waiting or prefilling or decoding:
        ops: list[Op] = []
        finished = []
        for i in list(decoding):
            ops.append(("decode", i, 1))
            decoding[i] -= 1
            if not decoding[i]:
                del decoding[i]
                finished.append(i)
        budget = chunk
        for entry in prefilling:
            n = min(budget, trace.context - entry[1])
            if n:
                ops.append(("chunk", entry[0], n))
                entry[1] += n
                budget -= n
        while waiting and budget:
            i = waiting.popleft()
            n = min(budget, trace.context)
            ops.append(("admit", i, n))
            prefilling.append([i, n])
            budget -= n
        while prefilling and prefilling[0][1] == trace.context:
            decoding[prefilling.popleft()[0]] = decode_steps
        ops.extend(("free", i, 0) for i in finished)
        steps.append(ops)
    return steps


class ReplayEngine(Protocol):
    """One KV-cache manager driven by a trace. Each call does what an engine's scheduler and its
    post-step bookkeeping do for one request; ``tokens`` are those the request actually ran."""

    def admit(self, i: int, max_new: int) -> tuple[int, int] | None:
        """Prefix match + first step of up to ``max_new`` tokens: (hit tokens, tokens run), or None
        when the engine keeps the request waiting this step (changing nothing it holds)."""
        ...

    def grow(self, i: int, max_new: int, prefill: bool) -> int:
        """Back the next step of request ``i``: a prefill chunk of up to ``max_new`` tokens
        (``prefill``), or one decode token; returns the tokens it runs (0: a chunk of a prompt that a
        prefix hit already covered, nothing to do)."""
        ...

    def after(self, i: int, tokens: int) -> None:
        """After the step: ``tokens`` more are computed; past the prompt, a token is appended."""
        ...

    def end_step(self) -> None:
        """Per-step work that is not any one request's (collecting table deltas)."""
        ...

    def free(self, i: int) -> None:
        ...


@dataclass
class RunRecord:
    """One replay: microseconds per operation (by kind), per step, and hit tokens."""

    ops: dict[str, list[float]] = field(default_factory=dict)
    steps: list[float] = field(default_factory=list)
    hit_tokens: int = 0


def _kind(op: str, tokens: int, chunk: int) -> str | None:
    if op == "chunk":
        return "prefill_8k" if tokens == chunk else None  # partial chunks are not compared
    return op


def clock_cost_ns(samples: int = 1001, clock: Callable[[], int] = time.perf_counter_ns) -> int:
    """The median of back-to-back ``clock`` readings' differences: what one timed segment adds to
    what it times (``time.perf_counter_ns`` reads the CPU's counter, about 40 ns on the development
    machine; the process CPU clock is a system call there, about 500 ns)."""
    diffs = sorted(-(clock() - clock()) for _ in range(samples))
    return diffs[samples // 2]


def replay(engine: ReplayEngine, steps: list[list[Op]], chunk: int = CHUNK, time_ops: bool = True) -> RunRecord:
    """Run ``steps`` on ``engine``: per step, first every request's allocation (admit / grow), then
    after the (absent) forward pass every request's post-step work, then ``end_step``, then the
    frees. An admission the engine defers (it waits for a prefix another request is computing) is
    retried in the next step, before that step's own admissions.

    ``time_ops``: time each operation (its allocation plus its post-step work, each segment on the
    wall clock ``time.perf_counter_ns``, less :func:`clock_cost_ns`) into ``ops``; a deferred
    attempt counts for no operation. A segment lasts microseconds; one that loses the CPU reads
    high, and the lowest over several runs leaves it out
    (:func:`atom.bench.control_plane_summary.lowest_per_call`). Else only whole steps are timed, in
    CPU time (``time.process_time_ns``: a step can last milliseconds, long enough to lose the CPU
    under load, and other processes' time is then not counted), one reading at each end, into
    ``steps`` (per-operation readings would add their own cost to the step)."""
    if not time_ops:
        return _replay_steps(engine, steps)
    rec, clock, deferred = RunRecord(), time.perf_counter_ns, []
    cost = clock_cost_ns(clock=clock)
    for ops in _retrying(steps, deferred):
        ran: list[tuple[str, int, int, int]] = []  # (kind, request, tokens, ns so far)
        for op, i, n in ops:
            if op == "free":
                continue
            t0 = clock()
            if op == "admit":
                got = engine.admit(i, n)
                if got is None:
                    deferred.append((op, i, n))
                    continue
                hit, tokens = got
                rec.hit_tokens += hit
            else:
                tokens = engine.grow(i, n, op == "chunk")
            if tokens:
                ran.append((op, i, tokens, clock() - t0 - cost))
        for op, i, tokens, dt in ran:
            t0 = clock()
            engine.after(i, tokens)
            kind = _kind(op, tokens, chunk)
            if kind is not None:
                rec.ops.setdefault(kind, []).append((dt + clock() - t0 - cost) / 1e3)
        engine.end_step()
        for op, i, _ in ops:
            if op == "free":
                t0 = clock()
                engine.free(i)
                rec.ops.setdefault("free", []).append((clock() - t0 - cost) / 1e3)
    return rec


def _replay_steps(engine: ReplayEngine, steps: list[list[Op]]) -> RunRecord:
    """:func:`replay` timing whole steps: the same calls in the same order, with nothing in the step
    but the engine's calls and the loop that makes them (what the step figure should measure)."""
    rec, clock, deferred = RunRecord(), time.process_time_ns, []
    cost = clock_cost_ns(clock=clock)
    for ops in _retrying(steps, deferred):
        t_step = clock()
        ran: list[tuple[int, int]] = []  # (request, tokens run)
        for op, i, n in ops:  # (the commonest operation tested first)
            if op == "decode" or op == "chunk":
                tokens = engine.grow(i, n, op == "chunk")
            elif op == "admit":
                got = engine.admit(i, n)
                if got is None:
                    deferred.append((op, i, n))
                    continue
                rec.hit_tokens += got[0]
                tokens = got[1]
            else:
                continue  # (frees run after the step)
            if tokens:
                ran.append((i, tokens))
        for i, tokens in ran:
            engine.after(i, tokens)
        engine.end_step()
        for op, i, _ in ops:
            if op == "free":
                engine.free(i)
        rec.steps.append((clock() - t_step - cost) / 1e3)
    return rec


def _retrying(steps: list[list[Op]], deferred: list[Op]) -> Iterator[list[Op]]:
    """Each step's operations, the admissions the caller deferred in the step before (appended to
    ``deferred``, which is emptied as each step starts) placed first (:func:`_with_deferred`); raises
    at the end if some are still deferred."""
    for trace_ops in steps:
        ops = _with_deferred(trace_ops, deferred)
        deferred.clear()
        yield ops
    if deferred:
        raise RuntimeError(f"admissions still deferred when the trace ended: {deferred}")


def _with_deferred(ops: list[Op], deferred: list[Op]) -> list[Op]:
    """``ops`` with the deferred admissions placed before its first admission or free."""
    if not deferred:
        return ops
    at = next((k for k, (op, _, _) in enumerate(ops) if op in ("admit", "free")), len(ops))
    return ops[:at] + deferred + ops[at:]
