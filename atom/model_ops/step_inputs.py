"""Turning a frozen ScheduledBatch into the tensors one forward step needs.

``PageTables`` is the runner-side copy of every live request's page tables, one row per live request
(at most ``max_num_seqs``; a request gets the lowest free row when its full tables arrive and gives
it back when it is released, so every rank that applies the same batches assigns the same rows), plus
one padding row (``padding_row``, the last) that no request ever gets: every page -1, so padded
decode steps (:mod:`atom.model_ops.decode_buffers`) point their padding tokens at it. It
is kept current by the batch's deltas: full rows for newly admitted requests, changed entries
otherwise, rows cleared on release; nothing is re-translated from logical ids. A request's table
row and its compressor-state page (``state_slot``, a page of the arena's state owner) are distinct.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from atom.kernels._common import next_pow2
from atom.step_contract import ScheduledBatch
from atom.kv.page_map import COMPRESS, SWA

__all__ = ["EntryList", "PageTables", "RowSubset", "StepInputs", "build_step_inputs", "row_subset"]


class PageTables:
    """``comp`` / ``swa``: int32 ``[num_rows + 1, max_blocks]`` physical pages, -1 = none (the last row is
    ``padding_row``)."""

    def __init__(self, num_rows: int, max_blocks: int, device: str | torch.device = "cpu") -> None:
        self.comp = torch.full((num_rows + 1, max_blocks), -1, dtype=torch.int32, device=device)
        self.swa = torch.full((num_rows + 1, max_blocks), -1, dtype=torch.int32, device=device)
        self.padding_row = num_rows
        self.row_of: dict[int, int] = {}
        self._free_rows = list(range(num_rows - 1, -1, -1))

    def apply(self, batch: ScheduledBatch) -> None:
        for sid in batch.released_ids:
            row = self.row_of.pop(sid, None)
            if row is not None:
                self.comp[row].fill_(-1)
                self.swa[row].fill_(-1)
                self._free_rows.append(row)
                self._free_rows.sort(reverse=True)
        for new in batch.new_tables:
            row = self.row_of.get(new.seq_id)
            if row is None:
                assert self._free_rows, f"more live requests than the {self.padding_row} table rows"
                row = self.row_of[new.seq_id] = self._free_rows.pop()
            self._write_row(self.comp[row], new.comp_pages)
            self._write_row(self.swa[row], new.swa_pages)
        for u in batch.table_updates:  # one run of consecutive entries each
            table = self.comp if u.owner == COMPRESS else self.swa
            assert u.owner in (COMPRESS, SWA) and u.index + len(u.pages) <= table.shape[1], f"bad table update {u}"
            if len(u.pages) == 1:
                table[self.row_of[u.seq_id], u.index] = u.pages[0]
            else:
                table[self.row_of[u.seq_id], u.index:u.index + len(u.pages)] = torch.tensor(
                    u.pages, dtype=torch.int32, device=table.device)

    @staticmethod
    def _write_row(row: torch.Tensor, pages: tuple[int, ...]) -> None:
        row.fill_(-1)
        if pages:
            row[: len(pages)] = torch.tensor(pages, dtype=torch.int32, device=row.device)


@dataclass(frozen=True)
class EntryList:
    """The compressed entries one step completes for one compress ratio, padded to a static size.

    ``seq [E]`` (long): batch index of the entry's sequence, -1 = padding; ``ids [E]`` (long): the
    entry's index in its sequence (0 for padding). ``E = T // ratio + S`` for a step of ``T`` tokens
    over ``S`` sequences: a chunk of ``n`` tokens completes at most ``n // ratio + 1`` entries, so the
    size depends only on the step's shape, never on positions (graph-safe).
    """

    seq: torch.Tensor
    ids: torch.Tensor


@dataclass(frozen=True)
class RowSubset:
    """Some rows of each sequence's chunk, as a ragged batch of their own: ``rows [R]`` (long) flat
    token rows, ``cu_seqlens [S + 1]`` (int32) offsets into ``rows`` per sequence, ``pos_start [S]``
    (int32) position of each sequence's first selected row, ``max_len`` the longest selection."""

    rows: torch.Tensor
    cu_seqlens: torch.Tensor
    pos_start: torch.Tensor
    max_len: int


def row_subset(starts: list[int], counts: list[int], positions: list[int],
               device: str | torch.device) -> RowSubset:
    """Rows ``starts[s] .. starts[s] + counts[s] - 1`` of sequence ``s``, the first at ``positions[s]``."""
    rows, cu = [], [0]
    for first, n in zip(starts, counts):
        rows.extend(range(first, first + n))
        cu.append(cu[-1] + n)
    return RowSubset(torch.tensor(rows, dtype=torch.long, device=device),
                     torch.tensor(cu, dtype=torch.int32, device=device),
                     torch.tensor(positions, dtype=torch.int32, device=device), max(counts, default=0))


@dataclass
class StepInputs:
    """Flat token tensors plus per-sequence metadata (sequences in batch order).

    Everything a forward reads is a tensor, or a host value the scheduler's batch already fixed
    (``max_pos``, ``max_len``, ``any_reset``, ``any_restore``): the forward never reads a device value back.
    """

    token_ids: torch.Tensor  # long [N]
    positions: torch.Tensor  # long [N]
    token_slot: torch.Tensor  # int32 [N]: the table row of each token's request
    cu_seqlens: torch.Tensor  # int32 [S + 1]
    pos_start: torch.Tensor  # int32 [S]
    slots: torch.Tensor  # int32 [S]: compressor-state page of each request
    rows: torch.Tensor  # int32 [S]: table row of each request
    reset: torch.Tensor  # bool [S]: clear the state page before use (first step after admission)
    restore_src: torch.Tensor  # int32 [S] SWA page whose CSA state seeds the slot, -1 = none
    entries: dict[int, EntryList]  # compress ratio -> entries the step completes
    sample_rows: torch.Tensor  # long [K]: the token rows whose logits are sampled (last token of a sampling seq,
    # and with drafts every row from its last committed token on)
    max_pos: int  # the largest position in the step
    max_len: int  # the longest chunk in the step
    any_reset: bool
    any_restore: bool
    seq_ids: list[int]
    lengths: list[int]
    # speculative decoding: drafts per sequence, and (when any) the committed rows (the chunk without its
    # drafts): compressor state advances over these only, the accepted drafts' after verification
    num_draft: list[int]
    committed: RowSubset | None = None
    # tensors derived from the ones above that several layers need (e.g. the rows each CSA entry pools),
    # computed by the first layer that asks; empty when the step starts, and in every copy made with
    # dataclasses.replace (not an init field), since a copy with other token rows needs its own
    derived: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    def index_width(self, ratio: int) -> int:
        """How many compressed entries of ``ratio`` each query's index lists cover: the next power of two
        of the entries below the step's largest position (a few shapes across steps), so widths follow
        the longest context in the step, never ``max_model_len``."""
        return next_pow2((self.max_pos + 1) // ratio)

    def derive(self, key: tuple, make: Callable[[], Any]) -> Any:
        """``make()``, computed once per step for ``key`` (which must name everything ``make`` depends on
        besides this step's tensors and the page tables, both unchanged during the forward)."""
        if key not in self.derived:
            self.derived[key] = make()
        return self.derived[key]


def _entry_list(batch: ScheduledBatch, ratio: int, num_tokens: int, device: str | torch.device) -> EntryList:
    seq, ids = [], []
    for s, item in enumerate(batch.seqs):
        first, end = item.start_pos // ratio, (item.start_pos + item.num_tokens) // ratio
        seq.extend([s] * (end - first))
        ids.extend(range(first, end))
    pad = num_tokens // ratio + len(batch.seqs) - len(seq)
    return EntryList(torch.tensor(seq + [-1] * pad, dtype=torch.long, device=device),
                     torch.tensor(ids + [0] * pad, dtype=torch.long, device=device))


def build_step_inputs(batch: ScheduledBatch, tables: PageTables, device: str | torch.device = "cpu",
                      ratios: tuple[int, ...] = ()) -> StepInputs:
    """The step tensors of ``batch``; ``tables`` (already updated by the batch) gives the table rows;
    ``ratios``: the model's compress ratios (entry lists built for each)."""
    tokens, positions, token_slot, cu, sample_rows = [], [], [], [0], []
    rows = [tables.row_of[s.seq_id] for s in batch.seqs]
    for s, row in zip(batch.seqs, rows):
        tokens.extend(s.token_ids)
        positions.extend(range(s.start_pos, s.start_pos + s.num_tokens))
        token_slot.extend([row] * s.num_tokens)
        cu.append(cu[-1] + s.num_tokens)
        if s.sample:
            sample_rows.extend(range(cu[-1] - 1 - s.num_draft, cu[-1]))

    def i32(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int32, device=device)

    restore = [s.restore_page for s in batch.seqs]
    drafts = [s.num_draft for s in batch.seqs]
    committed = None
    if any(drafts):
        committed = row_subset(cu[:-1], [s.num_committed for s in batch.seqs], [s.start_pos for s in batch.seqs],
                               device)
    return StepInputs(
        token_ids=torch.tensor(tokens, dtype=torch.long, device=device),
        positions=torch.tensor(positions, dtype=torch.long, device=device),
        token_slot=i32(token_slot), cu_seqlens=i32(cu), pos_start=i32([s.start_pos for s in batch.seqs]),
        slots=i32([s.state_slot for s in batch.seqs]), rows=i32(rows),
        reset=torch.tensor([s.state_reset for s in batch.seqs], dtype=torch.bool, device=device),
        restore_src=i32(restore),
        entries={r: _entry_list(batch, r, len(tokens), device) for r in sorted(set(ratios) - {0})},
        sample_rows=torch.tensor(sample_rows, dtype=torch.long, device=device),
        max_pos=max(positions), max_len=max(s.num_tokens for s in batch.seqs),
        any_reset=any(s.state_reset for s in batch.seqs), any_restore=any(p >= 0 for p in restore),
        seq_ids=[s.seq_id for s in batch.seqs], lengths=[s.num_tokens for s in batch.seqs], num_draft=drafts,
        committed=committed)
