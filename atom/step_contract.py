"""The scheduler -> runner contract: frozen dataclasses, and nothing else crosses.

Per-request page tables live on the runner side and are kept current by deltas: a request's full
tables are shipped once (``new_tables``, when it is admitted), then only the entries that changed
(``table_updates``, one per run of consecutive entries that changed), so a step's size does not
grow with context length. Every table entry is a
physical page or -1 (no page: out of window, never materialised); kernels skip -1, never fall back
to page 0.

The host tier's copy orders ride in the batch too (``host_stores``: device pages written back to host
pages, ``host_loads``: host pages restored into device pages, :class:`HostCopy`); the runner executes
every store, then every load, before the step's forward.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from atom.kv.tables import HostCopy, NewTables, TableUpdate
from atom.output.request_output import TokenLogprobs
from atom.sampling_params import SamplingParams

__all__ = ["ScheduledSeq", "ScheduledBatch", "RunnerOutput", "ReadyOutput", "HostCopy"]


@dataclass(frozen=True, slots=True)
class ScheduledSeq:
    """One request's work in a step: run ``token_ids`` at positions ``start_pos ..``."""

    seq_id: int
    start_pos: int
    token_ids: tuple[int, ...]
    sample: bool  # the step ends at the request's last token: sample the next one
    state_slot: int
    state_reset: bool  # first step after admission: clear the slot (kv 0, score -inf) before use
    restore_page: int  # physical SWA page whose CSA boundary state seeds the slot (prefix hit), or -1
    params: SamplingParams
    # (prompt ids, output ids) on the first step after admission when the params edit logits from the
    # history (penalties, min_tokens); None otherwise, so a step's size does not grow with the context
    history: tuple[tuple[int, ...], tuple[int, ...]] | None = None
    # speculative decoding: the last ``num_draft`` of ``token_ids`` are proposed tokens to verify (their
    # KV rows are written, but they count as computed only once accepted; the rows of the step from the
    # last committed token on are all sampled)
    num_draft: int = 0
    # the token after the chunk when it is already known (a prefill chunk that does not sample), else -1
    lookahead: int = -1

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_committed(self) -> int:
        """Tokens of the step that are part of the sequence already (not drafts)."""
        return len(self.token_ids) - self.num_draft

    @property
    def drafts(self) -> tuple[int, ...]:
        return self.token_ids[len(self.token_ids) - self.num_draft:]


@dataclass(frozen=True, slots=True)
class ScheduledBatch:
    """Everything the runner needs for one step."""

    step: int
    seqs: tuple[ScheduledSeq, ...]
    new_tables: tuple[NewTables, ...]
    table_updates: tuple[TableUpdate, ...]
    released_ids: tuple[int, ...]  # requests whose runner-side tables can be dropped
    host_stores: tuple[HostCopy, ...] = ()  # device -> host page copies, before the loads
    host_loads: tuple[HostCopy, ...] = ()  # host -> device page copies, before the forward

    @property
    def num_tokens(self) -> int:
        return sum(s.num_tokens for s in self.seqs)


@dataclass(frozen=True, slots=True)
class RunnerOutput:
    """Sampled token per request that had ``sample=True``, and the log-probabilities of those whose
    params asked for them (``SamplingParams.logprobs``).

    Speculative decoding: ``accepted[seq_id]`` drafts of a request's step were accepted (its first
    ``accepted`` drafts come before ``sampled``, which is the correction or bonus token);
    ``drafts[seq_id]``: tokens the runner's draft model proposes after ``sampled`` (the MTP draft).

    ``logits``: per scheduled request, the logits of every row it ran this step (a ``[num_tokens,
    vocab]`` tensor), only from a runner built with ``keep_logits`` (tests that compare the engine
    with the reference model step by step); empty otherwise, so serving never keeps them.
    """

    sampled: Mapping[int, int]
    logprobs: Mapping[int, TokenLogprobs] = field(default_factory=dict)
    accepted: Mapping[int, int] = field(default_factory=dict)
    drafts: Mapping[int, tuple[int, ...]] = field(default_factory=dict)
    logits: Mapping[int, Any] = field(default_factory=dict)


class ReadyOutput:
    """The handle of a step that ran to completion when it was launched (a runner without a step thread,
    or without ``launch``): ``result()`` gives its :class:`RunnerOutput`, as a launched step's future does."""

    __slots__ = ("_out",)

    def __init__(self, out: RunnerOutput) -> None:
        self._out = out

    def result(self) -> RunnerOutput:
        return self._out
