"""A request as the scheduler sees it: its tokens and its progress.

Everything the KV arena lends a request (compressed and SWA block tables, the state page, the
restore source, how far its blocks are published) is the block manager's
(:class:`~atom.kv.kv_holdings.KvHoldings`), never the sequence's. What the sequence keeps
beside its tokens is derived from them alone: the chained block hashes and exact block keys
(:mod:`atom.kv.kv_block`), computed once per block.
"""

from __future__ import annotations

import enum
import itertools

from atom.kv.kv_block import chain_hashes
from atom.kv.prefix_stats import PrefixStats
from atom.sampling_params import SamplingParams

__all__ = ["SequenceStatus", "Sequence"]


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED_STOPPED = "stop"
    FINISHED_LENGTH = "length"
    FINISHED_ABORTED = "abort"

    @property
    def finished(self) -> bool:
        return self.value in ("stop", "length", "abort")


_ids = itertools.count()


def _with_room(token_ids: list[int], room: int) -> list[int]:
    """A copy of ``token_ids`` with memory for ``room`` more ids already allocated (CPython keeps a
    list's memory when it shrinks by less than half). A copy made to its exact size reallocates on
    its first append, which for a long prompt is the first output token, appended inside a step:
    copying a 128K-token list there took tenths of a millisecond. The room is reserved here, when
    the request is built, outside the step."""
    out = [*token_ids, *[0] * room]
    del out[len(out) - room:]
    return out


class Sequence:
    """One request's token ids and progress."""

    def __init__(self, token_ids: list[int], params: SamplingParams, block_size: int,
                 seq_id: int | None = None, arrival: float = 0.0) -> None:
        if not token_ids:
            raise ValueError("a request needs at least one prompt token")
        self.seq_id = next(_ids) if seq_id is None else seq_id
        self.token_ids = _with_room(token_ids, min(params.max_tokens, len(token_ids) // 8 + 64))
        self.num_prompt_tokens = len(token_ids)
        self.params = params
        self.block_size = block_size
        self.arrival = arrival
        self.status = SequenceStatus.WAITING
        self.num_computed_tokens = 0
        self.num_cached_tokens = 0
        self.block_hashes: list[int] = []  # chained hash of each full block computed so far
        self.block_keys: list[bytes] = []  # each full block's token ids, packed (exact hit check)
        self.stats = PrefixStats(prompt_tokens=len(token_ids))
        self.num_preemptions = 0
        self.error: str | None = None

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

    def hashes_upto(self, num_blocks: int) -> list[int]:
        """The chained hashes of at least the first ``num_blocks`` full blocks (computed once, then
        reused; the list itself, not a copy: callers read only its first ``num_blocks`` entries).
        ``block_keys`` is extended alongside."""
        if len(self.block_hashes) < num_blocks:
            chain_hashes(self.token_ids, self.block_size, num_blocks, self.block_hashes, self.block_keys)
        return self.block_hashes

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)

    def __repr__(self) -> str:
        return (f"Sequence(id={self.seq_id}, status={self.status.value}, tokens={len(self)}, "
                f"computed={self.num_computed_tokens})")
