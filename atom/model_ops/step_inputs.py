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
from atom.model_ops.host_staging import stage

__all__ = ["EntryList", "PageTables", "RowSubset", "StepInputs", "build_step_inputs", "row_subset"]


class PageTables:
    """``comp`` / ``swa``: int32 ``[num_rows + 1, max_blocks]`` physical pages, -1 = none (the last row is
    ``padding_row``); both are views of one tensor, so a step's deltas to either land in one scatter."""

    def __init__(self, num_rows: int, max_blocks: int, device: str | torch.device = "cpu") -> None:
        self._both = torch.full((2, num_rows + 1, max_blocks), -1, dtype=torch.int32, device=device)
        self.comp, self.swa = self._both[0], self._both[1]
        self.padding_row = num_rows
        self.row_of: dict[int, int] = {}
        self._free_rows = list(range(num_rows - 1, -1, -1))

    def apply(self, batch: ScheduledBatch) -> None:
        """Apply the batch's deltas: released rows and the rows of newly arrived full tables are cleared on
        the device (fills, no copy); every page entry written (full tables and updates) goes through one
        staged copy of (flat index, page) pairs and one scatter, after the clears."""
        for sid in batch.released_ids:
            row = self.row_of.pop(sid, None)
            if row is not None:
                self._both[:, row].fill_(-1)
                self._free_rows.append(row)
                self._free_rows.sort(reverse=True)
        width, rows = self._both.shape[2], self._both.shape[1]
        entries: dict[int, int] = {}  # flat index -> page; a later delta to the same entry wins, as applied in order
        for new in batch.new_tables:
            row = self.row_of.get(new.seq_id)
            if row is None:
                assert self._free_rows, f"more live requests than the {self.padding_row} table rows"
                row = self.row_of[new.seq_id] = self._free_rows.pop()
            self._both[:, row].fill_(-1)
            for table, row_pages in enumerate((new.comp_pages, new.swa_pages)):
                assert len(row_pages) <= width, f"{len(row_pages)} pages for a table row of {width}"
                base = (table * rows + row) * width
                entries.update(zip(range(base, base + len(row_pages)), row_pages))
        for u in batch.table_updates:  # one run of consecutive entries each
            assert u.owner in (COMPRESS, SWA) and u.index + len(u.pages) <= width, f"bad table update {u}"
            base = ((0 if u.owner == COMPRESS else 1) * rows + self.row_of[u.seq_id]) * width + u.index
            entries.update(zip(range(base, base + len(u.pages)), u.pages))
        if entries:  # distinct indices: the scatter's order does not matter
            index, values = stage([list(entries), list(entries.values())], self._both.device)
            self._both.view(-1).scatter_(0, index, values.to(torch.int32))


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
    rows_t, cu_t, pos_t = stage([rows, cu, positions], device)
    return RowSubset(rows_t, cu_t.to(torch.int32), pos_t.to(torch.int32), max(counts, default=0))


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


def _entry_list(batch: ScheduledBatch, ratio: int, num_tokens: int) -> tuple[list[int], list[int]]:
    """The host lists ``(seq, ids)`` of the :class:`EntryList` of ``ratio``."""
    seq, ids = [], []
    for s, item in enumerate(batch.seqs):
        first, end = item.start_pos // ratio, (item.start_pos + item.num_tokens) // ratio
        seq.extend([s] * (end - first))
        ids.extend(range(first, end))
    pad = num_tokens // ratio + len(batch.seqs) - len(seq)
    return seq + [-1] * pad, ids + [0] * pad


def build_step_inputs(batch: ScheduledBatch, tables: PageTables, device: str | torch.device = "cpu",
                      ratios: tuple[int, ...] = ()) -> StepInputs:
    """The step tensors of ``batch``; ``tables`` (already updated by the batch) gives the table rows;
    ``ratios``: the model's compress ratios (entry lists built for each). Every tensor comes from one
    host-to-device copy (:func:`atom.model_ops.host_staging.stage`)."""
    tokens, positions, token_slot, cu, sample_rows = [], [], [], [0], []
    rows = [tables.row_of[s.seq_id] for s in batch.seqs]
    for s, row in zip(batch.seqs, rows):
        tokens.extend(s.token_ids)
        positions.extend(range(s.start_pos, s.start_pos + s.num_tokens))
        token_slot.extend([row] * s.num_tokens)
        cu.append(cu[-1] + s.num_tokens)
        if s.sample:
            sample_rows.extend(range(cu[-1] - 1 - s.num_draft, cu[-1]))

    restore = [s.restore_page for s in batch.seqs]
    drafts = [s.num_draft for s in batch.seqs]
    committed = None
    if any(drafts):
        committed = row_subset(cu[:-1], [s.num_committed for s in batch.seqs], [s.start_pos for s in batch.seqs],
                               device)
    comp_ratios = sorted(set(ratios) - {0})
    entry_lists = [part for r in comp_ratios for part in _entry_list(batch, r, len(tokens))]
    (token_ids, pos, slot_of_token, cu_t, starts, slots, rows_t, reset, restore_t, sampled, *entry_parts) = stage(
        [tokens, positions, token_slot, cu, [s.start_pos for s in batch.seqs], [s.state_slot for s in batch.seqs],
         rows, [int(s.state_reset) for s in batch.seqs], restore, sample_rows] + entry_lists, device)
    i32 = torch.int32
    return StepInputs(
        token_ids=token_ids, positions=pos, token_slot=slot_of_token.to(i32), cu_seqlens=cu_t.to(i32),
        pos_start=starts.to(i32), slots=slots.to(i32), rows=rows_t.to(i32), reset=reset != 0,
        restore_src=restore_t.to(i32),
        entries={r: EntryList(entry_parts[2 * i], entry_parts[2 * i + 1]) for i, r in enumerate(comp_ratios)},
        sample_rows=sampled,
        max_pos=max(positions), max_len=max(s.num_tokens for s in batch.seqs),
        any_reset=any(s.state_reset for s in batch.seqs), any_restore=any(p >= 0 for p in restore),
        seq_ids=[s.seq_id for s in batch.seqs], lengths=[s.num_tokens for s in batch.seqs], num_draft=drafts,
        committed=committed)
