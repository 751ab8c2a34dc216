"""Which kind of step a fake-device case measures, and getting the engine there first.

A case of :mod:`atom.bench.gpu_readiness` names a step ("decode b8", "mtp verify", ...), and its figures
mean something only if the step it counted was that step. The steps before it run uncounted until the
scheduler's requests are in the state the kind needs (:func:`warm_up`), and the counted step's batch is
classified from what the scheduler sent (:func:`step_kind`) and refused when it is not the named kind or
leaves a request out (:func:`check_step`): a decode case whose step holds a prefill token is an error, not
a figure.

Kinds (:data:`STEP_KINDS`), from the rows of a :class:`~atom.step_contract.ScheduledBatch`; a row *decodes*
when it runs exactly one committed token at or past its prompt's end (plus any drafts), otherwise it is a
*prefill chunk* (prompt tokens, or a recompute after a preemption):

* ``decode``: every row decodes, none carries drafts;
* ``verify``: every row decodes and carries drafts to verify;
* ``prefill``: every row is a prefill chunk;
* ``mixed``: decode rows and at least one prefill chunk in the same step.

Anything else (an empty step, drafts on some decode rows only) is ``other``, which no case names.
"""

from __future__ import annotations

from typing import Mapping

from atom.model_engine.llm_engine import LLMEngine
from atom.model_engine.scheduler import Scheduler
from atom.step_contract import ScheduledBatch, ScheduledSeq

__all__ = ["STEP_KINDS", "MAX_WARM_STEPS", "step_kind", "describe_step", "ready_for", "warm_up", "check_step"]

STEP_KINDS = ("decode", "verify", "prefill", "mixed")
MAX_WARM_STEPS = 64  # a case whose state takes longer than this is misconfigured (budget, prompts)


def _decodes(row: ScheduledSeq, prompt_len: int) -> bool:
    """One committed token at or past the prompt's end: the step decides the request's next token."""
    return row.num_committed == 1 and row.start_pos >= prompt_len


def step_kind(batch: ScheduledBatch, prompt_lens: Mapping[int, int]) -> str:
    """The kind of ``batch`` (one of :data:`STEP_KINDS`, or ``other``); ``prompt_lens`` maps each scheduled
    request's id to its prompt length (``KeyError`` for a request it lacks)."""
    decoding = [row for row in batch.seqs if _decodes(row, prompt_lens[row.seq_id])]
    chunks = len(batch.seqs) - len(decoding)
    if not batch.seqs:
        return "other"
    if chunks:
        return "mixed" if decoding else "prefill"
    drafted = sum(1 for row in decoding if row.num_draft > 0)
    if drafted == 0:
        return "decode"
    return "verify" if drafted == len(decoding) else "other"


def describe_step(batch: ScheduledBatch, prompt_lens: Mapping[int, int]) -> str:
    """``"<kind> <rows>r/<tokens>t"``: the kind, the requests and the tokens of ``batch`` (the table's step
    column)."""
    return f"{step_kind(batch, prompt_lens)} {len(batch.seqs)}r/{batch.num_tokens}t"


def ready_for(kind: str, sched: Scheduler, num_requests: int, drafts: int = 0) -> bool:
    """Whether the next step ``sched`` schedules can be of ``kind``, for a case that admitted
    ``num_requests`` requests: ``prefill`` before any has run; ``decode`` and ``verify`` once every one runs
    past its prompt (``verify``: with ``drafts`` drafts waiting for each in the scheduler's draft source);
    ``mixed`` once some decode while another is still in its prompt. ``ValueError`` for an unknown kind."""
    if kind not in STEP_KINDS:
        raise ValueError(f"step kind {kind!r}: expected one of {', '.join(STEP_KINDS)}")
    running = sched.running
    if kind == "prefill":
        return len(sched.waiting) == num_requests
    if sched.waiting or len(running) != num_requests:
        return False
    decoding = [seq for seq in running if not seq.in_prefill]
    if kind == "mixed":
        return 0 < len(decoding) < len(running)
    if len(decoding) != len(running):
        return False
    if kind == "decode":
        return True
    return sched.drafter is not None and all(len(sched.drafter.propose(seq, drafts)) == drafts for seq in running)


def warm_up(engine: LLMEngine, kind: str, num_requests: int, drafts: int = 0, name: str = "case") -> int:
    """Run ``engine``'s steps until the next can be of ``kind`` (:func:`ready_for`); the number run.
    ``RuntimeError`` naming the case ``name`` when :data:`MAX_WARM_STEPS` steps do not get there."""
    for steps in range(MAX_WARM_STEPS + 1):
        if ready_for(kind, engine.scheduler, num_requests, drafts):
            return steps
        engine.step()
    raise RuntimeError(f"{name}: no {kind} step is possible after {MAX_WARM_STEPS} steps "
                       f"(running {engine.scheduler.running}, waiting {len(engine.scheduler.waiting)})")


def check_step(batch: ScheduledBatch, prompt_lens: Mapping[int, int], kind: str, num_requests: int,
               name: str = "case") -> None:
    """Refuse a measured step that is not what case ``name`` names: ``RuntimeError`` when ``batch`` is not
    of ``kind`` or does not schedule all ``num_requests`` requests."""
    got = step_kind(batch, prompt_lens)
    if got != kind or len(batch.seqs) != num_requests:
        rows = ", ".join(f"{row.seq_id}@{row.start_pos}+{row.num_tokens}" for row in batch.seqs)
        raise RuntimeError(f"{name}: the measured step is {describe_step(batch, prompt_lens)}, expected {kind} "
                           f"over all {num_requests} requests (rows id@position+tokens: {rows})")
