"""Logical id -> physical page maps for the three arena owners, allocated all or nothing.

Kept apart from :class:`~atom.kv.unified_kv_arena.UnifiedKvArena` because the trace
simulator runs the same block manager over other arenas (a fixed split, a byte-granular oracle):
they differ only in where a page's memory comes from, which subclasses say through
:meth:`can_alloc`, :meth:`_shortfall`, :meth:`_take_page` and :meth:`_give_back`.

Two kinds of map. The KV owners (``swa``, ``compress``) are lent logical ids by a block pool, dense
from 0: their map is a *page table*, a list indexed by logical id (-1: no page), and the pool keeps
that very list as its column of pages (:meth:`LogicalPageMap.page_table`), so a block's page is
recorded once. Only the arena writes it; backing 64 ids is 64 list stores, with no hashing, no
table resize and no second copy to keep in step. The ``state`` owner's logical ids are request ids
(unbounded over a server's life, few live at once): a dict.
"""

from __future__ import annotations

import enum
from typing import Iterable, Sequence

from atom.kv.chunk_arena import ArenaEmpty, ArenaError

__all__ = ["Owner", "SWA", "COMPRESS", "STATE", "OWNERS", "LogicalPageMap"]


class Owner(enum.StrEnum):
    """Who a page of the arena belongs to. A ``StrEnum``: each member equals its value string, so it
    also works as a dict key or keyword argument (``alloc(swa=...)``)."""

    SWA = "swa"  # one B-token block of raw SWA rows of every layer (+ the CSA boundary state)
    COMPRESS = "compress"  # one B-token block of compressed rows (+ indexer keys) of every compressed layer
    STATE = "state"  # one admitted request's live compressor state (logical id = its seq id)


SWA, COMPRESS, STATE = Owner.SWA, Owner.COMPRESS, Owner.STATE
OWNERS = (SWA, COMPRESS, STATE)


class LogicalPageMap:
    """The maps and the all-or-nothing ``alloc`` / ``free`` every arena shares."""

    def __init__(self) -> None:
        self._tables: dict[str, list[int]] = {SWA: [], COMPRESS: []}  # lid -> page, -1 = none
        self._state: dict[int, int] = {}  # STATE: request id -> page
        self._unmapped = {owner: 0 for owner in OWNERS}  # pages held without a logical id (take_unmapped)

    # ---- what a subclass provides -------------------------------------------------------------
    def can_alloc(self, swa: int = 0, compress: int = 0, state: int = 0) -> bool:
        raise NotImplementedError

    def can_alloc_one(self, owner: str, n: int) -> bool:
        """:meth:`can_alloc` of ``n`` pages of one owner (arenas may answer it more cheaply)."""
        return self.can_alloc(**{str(owner): n})

    def _shortfall(self, swa: int, compress: int, state: int) -> str:
        """Why ``swa`` + ``compress`` + ``state`` new pages do not fit (for the :class:`ArenaEmpty` message)."""
        raise NotImplementedError

    def fits_after_eviction(self, swa: int, compress: int, state: int, kept: dict[str, tuple[int, int]]) -> bool:
        """Whether ``swa`` + ``compress`` + ``state`` new pages would fit once every page not in ``kept`` was
        freed; ``kept[owner]`` = (pages that stay, chunks holding them). Lets the block manager
        check a shortfall can be met before it evicts anything."""
        raise NotImplementedError

    def chunk_pages_used(self, owner: str, chunk: int) -> int:
        """Pages in use in ``chunk`` (which ``owner`` holds)."""
        raise NotImplementedError

    def _take_page(self, owner: str) -> int:
        raise NotImplementedError

    def _give_back(self, owner: str, page: int) -> None:
        raise NotImplementedError

    def _take_pages(self, owner: str, n: int) -> list[int]:
        """``n`` pages of ``owner`` (room was checked); arenas with a batched allocator override it."""
        return [self._take_page(owner) for _ in range(n)]

    def _give_back_pages(self, owner: str, pages: list[int]) -> None:
        for page in pages:
            self._give_back(owner, page)

    # ---- the maps -----------------------------------------------------------------------------
    def page_table(self, owner: str, num_ids: int) -> list[int]:
        """The page table of KV owner ``owner`` (logical id -> page, -1: none), grown in place to at
        least ``num_ids`` entries. A block pool keeps this list as its column of pages: it reads it,
        only the arena writes it."""
        table = self._tables[owner]
        if len(table) < num_ids:
            table += [-1] * (num_ids - len(table))
        return table

    def page(self, owner: str, lid: int) -> int:
        """Physical page of a backed logical id; ``KeyError`` if it has none."""
        page = self._lookup(owner, lid)
        if page < 0:
            raise KeyError(f"{owner} block {lid} has no arena page")
        return page

    def is_backed(self, owner: str, lid: int) -> bool:
        return self._lookup(owner, lid) >= 0

    def mapping(self, owner: str) -> dict[int, int]:
        """Every backed logical id of ``owner`` and its page (a copy, for checks and reports)."""
        if owner == STATE:
            return dict(self._state)
        return {lid: page for lid, page in enumerate(self._tables[owner]) if page >= 0}

    def num_mapped(self, owner: str) -> int:
        """Pages of ``owner`` that a logical id maps (a pass over a page table: for checks)."""
        if owner == STATE:
            return len(self._state)
        return len(self._tables[owner]) - self._tables[owner].count(-1)

    def _lookup(self, owner: str, lid: int) -> int:
        if owner == STATE:
            return self._state.get(lid, -1)
        table = self._tables[owner]
        return table[lid] if 0 <= lid < len(table) else -1

    # ---- allocation ---------------------------------------------------------------------------
    def alloc(self, swa: Sequence[int] = (), compress: Sequence[int] = (),
              state: Sequence[int] = ()) -> dict[str, list[int]]:
        """Give every listed logical id of each owner a page, all or nothing.

        Raises :class:`ArenaEmpty` (and changes nothing) when the pages do not fit, and
        :class:`ArenaError` when an id is already backed, repeated or negative.
        """
        wanted = ((SWA, swa), (COMPRESS, compress), (STATE, state))
        for owner, lids in wanted:
            dup = [lid for lid in lids if lid < 0 or self._lookup(owner, lid) >= 0]
            if dup or len(set(lids)) != len(lids):
                raise ArenaError(f"{owner}: logical ids already backed, repeated or negative: {dup or list(lids)}")
        if not self.can_alloc(len(swa), len(compress), len(state)):
            raise ArenaEmpty(self._shortfall(len(swa), len(compress), len(state)))
        out: dict[str, list[int]] = {owner: [] for owner in OWNERS}
        for owner, lids in wanted:
            if lids and owner != STATE:
                self.page_table(owner, max(lids) + 1)
            pages = out[owner]
            pages += (self._take_page(owner) for _ in lids)
            self._map(owner, lids, pages)
        return out

    def alloc_ids(self, owner: str, lids: list[int]) -> list[int]:
        """Pages for fresh logical ids of one owner (the block pools' batched path), all or nothing:
        :class:`ArenaEmpty` (changing nothing) when they do not fit. The ids are the pool's vacant
        ones, so they are not checked one by one (``check_integrity`` does)."""
        n = len(lids)
        if not self.can_alloc_one(owner, n):
            counts = {SWA: 0, COMPRESS: 0, STATE: 0}
            counts[owner] = n
            raise ArenaEmpty(self._shortfall(counts[SWA], counts[COMPRESS], counts[STATE]))
        pages = self._take_pages(owner, n)
        self._map(owner, lids, pages)
        return pages

    def _map(self, owner: str, lids: Sequence[int], pages: Sequence[int]) -> None:
        """Record ``lids[i]`` -> ``pages[i]``; a page table already spans the ids (a pool's ids are
        within the table it sized, :meth:`page_table`; :meth:`alloc` grows it first)."""
        if owner == STATE:
            self._state.update(zip(lids, pages))
            return
        table = self._tables[owner]
        for lid, page in zip(lids, pages):
            table[lid] = page

    def free(self, owner: str, lids: Iterable[int]) -> None:
        """Return the pages of these logical ids (each must be backed: :class:`ArenaError` otherwise,
        changing nothing)."""
        lids = list(lids)
        pages = [self._lookup(owner, lid) for lid in lids]
        if -1 in pages:
            raise ArenaError(f"{owner}: logical block {lids[pages.index(-1)]} freed but it holds no page")
        if len(set(lids)) != len(lids):
            raise ArenaError(f"{owner}: a logical block listed twice in one free: {lids}")
        if owner == STATE:
            for lid in lids:
                del self._state[lid]
        else:
            table = self._tables[owner]
            for lid in lids:
                table[lid] = -1
        self._give_back_pages(owner, pages)

    def free_ids(self, owner: str, lids: list[int]) -> None:
        """:meth:`free` for a block pool (the batched path, the twin of :meth:`alloc_ids`): the ids are
        the pool's own backed ids, so they are not checked one by one (``check_integrity`` does)."""
        table = self._tables[owner]
        pages = [table[lid] for lid in lids]
        assert -1 not in pages, f"{owner}: a logical block freed that holds no page"
        for lid in lids:
            table[lid] = -1
        self._give_back_pages(owner, pages)

    def free_one(self, owner: str, lid: int) -> None:
        """:meth:`free` of one logical id (a request's partly written last block, its state page)."""
        if owner == STATE:
            page = self._state.pop(lid, -1)
        else:
            table = self._tables[owner]
            page = table[lid] if 0 <= lid < len(table) else -1
            if page >= 0:
                table[lid] = -1
        if page < 0:
            raise ArenaError(f"{owner}: logical block {lid} freed but it holds no page")
        self._give_back(owner, page)

    # ---- pages without a logical id (a step's SWA blocks that leave the window in that step) ----
    def take_unmapped(self, owner: str, n: int) -> list[int]:
        """``n`` pages of ``owner`` held without a logical id, all or nothing (:class:`ArenaEmpty`,
        changing nothing). They count as used (and are counted, not mapped) until
        :meth:`give_back_unmapped` returns them or :meth:`map_unmapped` gives them ids."""
        if not self.can_alloc_one(owner, n):
            counts = {SWA: 0, COMPRESS: 0, STATE: 0}
            counts[owner] = n
            raise ArenaEmpty(self._shortfall(counts[SWA], counts[COMPRESS], counts[STATE]))
        pages = self._take_pages(owner, n)
        self._unmapped[owner] += n
        return pages

    def map_unmapped(self, owner: str, lids: Sequence[int], pages: Sequence[int]) -> None:
        """Unmapped pages ``pages`` (from :meth:`take_unmapped`) become the pages of fresh logical ids
        ``lids`` (same order)."""
        self._unmapped[owner] -= len(pages)
        self._map(owner, lids, pages)

    def give_back_unmapped(self, owner: str, pages: list[int]) -> None:
        """Return unmapped pages (from :meth:`take_unmapped`) to the free lists."""
        self._unmapped[owner] -= len(pages)
        self._give_back_pages(owner, pages)

    def num_unmapped(self, owner: str) -> int:
        """Pages of ``owner`` held without a logical id."""
        return self._unmapped[owner]

    def spare_pages(self, owner: str) -> list[int]:
        """Pages given back unmapped that the arena keeps to lend again first (none here: they go
        straight back to the free pages)."""
        return []

    def _check_maps(self) -> None:
        for owner in OWNERS:
            pages = list(self.mapping(owner).values())
            assert len(set(pages)) == len(pages), f"{owner}: two logical ids share a page"
            assert self._unmapped[owner] >= 0, f"{owner}: {self._unmapped[owner]} unmapped pages"
