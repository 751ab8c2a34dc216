"""Turning a frozen ScheduledBatch into the tensors one forward step needs.

``PageTables`` is the runner-side copy of every live request's page tables, one row per live request
(at most ``max_num_seqs``; a request gets the lowest free row when its full tables arrive and gives
it back when it is released, so every rank that applies the same batches assigns the same rows). It
is kept current by the batch's deltas: full rows for newly admitted requests, changed entries
otherwise, rows cleared on release; nothing is re-translated from logical ids. A request's table
row and its compressor-state page (``state_slot``, a page of the arena's state owner) are distinct.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from atom.model_engine.outputs import ScheduledBatch
from atom.model_engine.unified_kv_arena import COMPRESS, SWA

__all__ = ["PageTables", "StepInputs", "build_step_inputs"]


class PageTables:
    """``comp`` / ``swa``: int32 ``[num_rows, max_blocks]`` physical pages, -1 = none."""

    def __init__(self, num_rows: int, max_blocks: int, device: str | torch.device = "cpu") -> None:
        self.comp = torch.full((num_rows, max_blocks), -1, dtype=torch.int32, device=device)
        self.swa = torch.full((num_rows, max_blocks), -1, dtype=torch.int32, device=device)
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
                assert self._free_rows, f"more live requests than the {self.comp.shape[0]} table rows"
                row = self.row_of[new.seq_id] = self._free_rows.pop()
            self._write_row(self.comp[row], new.comp_pages)
            self._write_row(self.swa[row], new.swa_pages)
        for u in batch.table_updates:
            table = self.comp if u.owner == COMPRESS else self.swa
            assert u.owner in (COMPRESS, SWA)
            table[self.row_of[u.seq_id], u.index] = u.page

    @staticmethod
    def _write_row(row: torch.Tensor, pages: tuple[int, ...]) -> None:
        row.fill_(-1)
        if pages:
            row[: len(pages)] = torch.tensor(pages, dtype=torch.int32, device=row.device)


@dataclass
class StepInputs:
    """Flat token tensors plus per-sequence metadata (sequences in batch order)."""

    token_ids: torch.Tensor  # long [N]
    positions: torch.Tensor  # long [N]
    token_slot: torch.Tensor  # int32 [N]: the table row of each token's request
    cu_seqlens: torch.Tensor  # int32 [S + 1]
    pos_start: torch.Tensor  # int32 [S]
    slots: torch.Tensor  # int32 [S]: compressor-state page of each request
    rows: torch.Tensor  # int32 [S]: table row of each request
    reset_slots: list[int]  # state pages to clear before use (first step after admission)
    restore_src: torch.Tensor  # int32 [S] SWA page whose CSA state seeds the slot, -1 = none
    seq_ids: list[int]
    lengths: list[int]

    @property
    def any_restore(self) -> bool:
        return bool((self.restore_src >= 0).any())


def build_step_inputs(batch: ScheduledBatch, tables: PageTables, device: str | torch.device = "cpu") -> StepInputs:
    """The step tensors of ``batch``; ``tables`` (already updated by the batch) gives the table rows."""
    tokens, positions, token_slot, cu = [], [], [], [0]
    rows = [tables.row_of[s.seq_id] for s in batch.seqs]
    for s, row in zip(batch.seqs, rows):
        tokens.extend(s.token_ids)
        positions.extend(range(s.start_pos, s.start_pos + s.num_tokens))
        token_slot.extend([row] * s.num_tokens)
        cu.append(cu[-1] + s.num_tokens)

    def i32(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int32, device=device)

    return StepInputs(
        token_ids=torch.tensor(tokens, dtype=torch.long, device=device),
        positions=torch.tensor(positions, dtype=torch.long, device=device),
        token_slot=i32(token_slot), cu_seqlens=i32(cu), pos_start=i32([s.start_pos for s in batch.seqs]),
        slots=i32([s.state_slot for s in batch.seqs]), rows=i32(rows),
        reset_slots=[s.state_slot for s in batch.seqs if s.state_reset],
        restore_src=i32([s.restore_page for s in batch.seqs]),
        seq_ids=[s.seq_id for s in batch.seqs], lengths=[s.num_tokens for s in batch.seqs])
