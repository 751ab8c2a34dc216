"""Live compressor state: one page of the arena's ``state`` owner per admitted request.

A request's state page is taken together with its first KV pages (the block manager makes room for
all of them at once, so admission is all or nothing) and returned when the request ends or is
preempted. Its physical page id is the request's ``state_slot``: the runner binds one view per
state part over the arena's state pages and addresses them by that id.

A page is handed out *dirty* (it may hold another owner's old bytes): the scheduler marks the
request's first step ``state_reset`` so the runner clears its CSA rings (kv 0, score -inf) before
use, so the previous owner's rows never leak into the request's first compression; the HCA
accumulator needs no clearing because a block's first position never reads it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from atom.kv.page_map import STATE, LogicalPageMap

if TYPE_CHECKING:
    from atom.kv.kv_holdings import KvHoldings

__all__ = ["StatePages"]


class StatePages:
    """The state pages of live requests; logical id = ``seq_id`` (unique among live requests).

    The request's ``state_slot`` and the arena's map (``seq_id`` -> page) are the only records of a
    page: no third copy is kept here (taking and returning a page cost no dict work of their own;
    :meth:`check_integrity` compares the two)."""

    def __init__(self, arena: LogicalPageMap, has_state: bool) -> None:
        self.arena = arena
        self.has_state = has_state
        self._num_held = 0

    def num_held(self) -> int:
        return self._num_held

    def pages_needed(self, h: KvHoldings) -> int:
        """1 for a request that needs a state page and has none yet, else 0."""
        return int(self.has_state and h.state_slot < 0)

    def take(self, h: KvHoldings) -> None:
        """Give the request its state page; the caller made room (:class:`ArenaEmpty` if it did not)."""
        assert h.state_slot < 0, f"seq {h.seq_id} already holds state page {h.state_slot}"
        h.state_slot = self.arena.alloc_ids(STATE, [h.seq_id])[0]  # seq ids of live requests are distinct
        self._num_held += 1

    def give_back(self, h: KvHoldings) -> None:
        if h.state_slot < 0:
            return
        self.arena.free_one(STATE, h.seq_id)  # (ArenaError if the arena maps no page for it)
        h.state_slot = -1
        self._num_held -= 1

    def check_integrity(self, holdings: list[KvHoldings]) -> None:
        held = {h.seq_id: h.state_slot for h in holdings if h.state_slot >= 0}
        assert len(held) == self._num_held, f"{len(held)} requests hold a state page, {self._num_held} counted"
        assert len(set(held.values())) == len(held), "a state page held by two requests"
        for sid, page in held.items():
            assert self.arena.page(STATE, sid) == page, f"seq {sid}: stale state page"
