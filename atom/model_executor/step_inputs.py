"""Turning a frozen ScheduledBatch into the tensors one forward step needs.

``PageTables`` is the runner-side copy of every live request's page tables, one row per state slot
(a slot is unique per live request, so it doubles as the table row). It is kept current by the
batch's deltas: full rows for newly admitted requests, changed entries otherwise, rows cleared on
release; nothing is re-translated from logical ids.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from atom.model_engine.outputs import ScheduledBatch
from atom.model_engine.unified_kv_arena import COMPRESS, SWA

__all__ = ["PageTables", "StepInputs", "build_step_inputs"]


class PageTables:
    """``comp`` / ``swa``: int32 ``[num_slots, max_blocks]`` physical pages, -1 = none."""

    def __init__(self, num_slots: int, max_blocks: int, device: str | torch.device = "cpu") -> None:
        self.comp = torch.full((num_slots, max_blocks), -1, dtype=torch.int32, device=device)
        self.swa = torch.full((num_slots, max_blocks), -1, dtype=torch.int32, device=device)
        self.slot_of: dict[int, int] = {}

    def apply(self, batch: ScheduledBatch) -> None:
        for sid in batch.released_ids:
            slot = self.slot_of.pop(sid, None)
            if slot is not None:
                self.comp[slot].fill_(-1)
                self.swa[slot].fill_(-1)
        slots = {s.seq_id: s.state_slot for s in batch.seqs}
        for new in batch.new_tables:
            slot = slots[new.seq_id]
            self.slot_of[new.seq_id] = slot
            self._write_row(self.comp[slot], new.comp_pages)
            self._write_row(self.swa[slot], new.swa_pages)
        for u in batch.table_updates:
            table = self.comp if u.owner == COMPRESS else self.swa
            assert u.owner in (COMPRESS, SWA)
            table[self.slot_of[u.seq_id], u.index] = u.page

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
    token_slot: torch.Tensor  # int32 [N]: the state slot (= table row) of each token's request
    cu_seqlens: torch.Tensor  # int32 [S + 1]
    pos_start: torch.Tensor  # int32 [S]
    slots: torch.Tensor  # int32 [S]
    reset_slots: list[int]  # slots to clear before use (first step after admission)
    restore_src: torch.Tensor  # int32 [S] SWA page whose CSA state seeds the slot, -1 = none
    seq_ids: list[int]
    lengths: list[int]

    @property
    def any_restore(self) -> bool:
        return bool((self.restore_src >= 0).any())


def build_step_inputs(batch: ScheduledBatch, device: str | torch.device = "cpu") -> StepInputs:
    tokens, positions, token_slot, cu = [], [], [], [0]
    for s in batch.seqs:
        tokens.extend(s.token_ids)
        positions.extend(range(s.start_pos, s.start_pos + s.num_tokens))
        token_slot.extend([s.state_slot] * s.num_tokens)
        cu.append(cu[-1] + s.num_tokens)

    def i32(values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int32, device=device)

    return StepInputs(
        token_ids=torch.tensor(tokens, dtype=torch.long, device=device),
        positions=torch.tensor(positions, dtype=torch.long, device=device),
        token_slot=i32(token_slot), cu_seqlens=i32(cu), pos_start=i32([s.start_pos for s in batch.seqs]),
        slots=i32([s.state_slot for s in batch.seqs]),
        reset_slots=[s.state_slot for s in batch.seqs if s.state_reset],
        restore_src=i32([s.restore_page for s in batch.seqs]),
        seq_ids=[s.seq_id for s in batch.seqs], lengths=[s.num_tokens for s in batch.seqs])
