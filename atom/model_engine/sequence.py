"""A request as the scheduler sees it: tokens, progress, and the KV blocks it holds.

Regions of a sequence of ``n`` tokens (prompt + generated), with block size B and window W::

    positions  0 ............................ computed ........... n
               |<-- KV written (cached or run) -->|<-- to run ------>|
    compressed [ b0 ][ b1 ] ... [ b_k ]                 one block per B positions, held to the end
    swa        [ -1 ][ -1 ] ... [ tail blocks ]         blocks before (computed - W + 1) released

``comp_blocks`` / ``swa_blocks`` are logical ids (-1 = not held); ``comp_pages`` / ``swa_pages`` are
the physical pages, kept in step with them so the runner's tables are updated by deltas only.
"""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass

from atom.model_engine.kv_block import chain_hashes
from atom.sampling_params import SamplingParams

__all__ = ["SequenceStatus", "Sequence", "PrefixStats"]


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"

    @property
    def finished(self) -> bool:
        return self.value in ("stop", "length", "abort")


@dataclass(slots=True)
class PrefixStats:
    """Where a request's prompt tokens came from (set when it is admitted, tokens)."""

    prompt_tokens: int = 0
    reused: int = 0
    lost_to_evicted_kv: int = 0
    lost_to_swa_window: int = 0
    lost_to_csa_state: int = 0


_ids = itertools.count()


class Sequence:
    """One request's token ids, progress and block tables."""

    def __init__(self, token_ids: list[int], params: SamplingParams, block_size: int,
                 seq_id: int | None = None, arrival: float = 0.0) -> None:
        if not token_ids:
            raise ValueError("a request needs at least one prompt token")
        self.seq_id = next(_ids) if seq_id is None else seq_id
        self.token_ids = list(token_ids)
        self.num_prompt_tokens = len(token_ids)
        self.params = params
        self.block_size = block_size
        self.arrival = arrival
        self.status = SequenceStatus.WAITING
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0
        self.block_hashes: list[int] = []
        self.stats = PrefixStats(prompt_tokens=len(token_ids))
        self.num_preemptions = 0
        self.error: str | None = None
        self.reset_blocks()

    def reset_blocks(self) -> None:
        """Forget every held block (after they were released)."""
        self.comp_blocks: list[int] = []
        self.comp_pages: list[int] = []
        self.swa_blocks: list[int] = []
        self.swa_pages: list[int] = []
        self.swa_released_upto = 0
        self.published_upto = 0
        self.retain_boundaries: tuple[int, ...] = ()  # block boundaries whose SWA window outlives the window
        self.state_slot = -1
        self.state_fresh = False
        self.restore_page = -1

    # ---- tokens -------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def num_remaining(self) -> int:
        """Tokens whose KV is not written yet (at least the last token of a running request)."""
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def in_prefill(self) -> bool:
        return self.num_computed_tokens < self.num_prompt_tokens

    def block_tokens(self, j: int) -> tuple[int, ...]:
        return tuple(self.token_ids[j * self.block_size:(j + 1) * self.block_size])

    def hashes_upto(self, num_blocks: int) -> list[int]:
        """Chained hashes of the first ``num_blocks`` full blocks (computed once, then reused)."""
        if len(self.block_hashes) < num_blocks:
            self.block_hashes = chain_hashes(self.token_ids, self.block_size, num_blocks, self.block_hashes)
        return self.block_hashes[:num_blocks]

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)

    def __repr__(self) -> str:
        return (f"Sequence(id={self.seq_id}, status={self.status.value}, tokens={len(self)}, "
                f"computed={self.num_computed_tokens})")
