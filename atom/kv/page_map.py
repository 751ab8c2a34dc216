"""Logical id -> physical page maps for the three arena owners, allocated all or nothing.

Kept apart from :class:`~atom.kv.unified_kv_arena.UnifiedKvArena` because the trace
simulator runs the same block manager over other arenas (a fixed split, a byte-granular oracle):
they differ only in where a page's memory comes from, which subclasses say through
:meth:`can_alloc`, :meth:`_shortfall`, :meth:`_take_page` and :meth:`_give_back`.
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
        self._phys: dict[str, dict[int, int]] = {owner: {} for owner in OWNERS}

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

    # ---- shared -------------------------------------------------------------------------------
    def page(self, owner: str, lid: int) -> int:
        """Physical page of a backed logical id; ``KeyError`` if it has none."""
        try:
            return self._phys[owner][lid]
        except KeyError:
            raise KeyError(f"{owner} block {lid} has no arena page") from None

    def is_backed(self, owner: str, lid: int) -> bool:
        return lid in self._phys[owner]

    def alloc(self, swa: Sequence[int] = (), compress: Sequence[int] = (),
              state: Sequence[int] = ()) -> dict[str, list[int]]:
        """Give every listed logical id of each owner a page, all or nothing.

        Raises :class:`ArenaEmpty` (and changes nothing) when the pages do not fit, and
        :class:`ArenaError` when an id is already backed or listed twice.
        """
        wanted = ((SWA, swa), (COMPRESS, compress), (STATE, state))
        for owner, lids in wanted:
            dup = [lid for lid in lids if lid in self._phys[owner]]
            if dup or len(set(lids)) != len(lids):
                raise ArenaError(f"{owner}: logical ids already backed or repeated: {dup or list(lids)}")
        if not self.can_alloc(len(swa), len(compress), len(state)):
            raise ArenaEmpty(self._shortfall(len(swa), len(compress), len(state)))
        out: dict[str, list[int]] = {owner: [] for owner in OWNERS}
        for owner, lids in wanted:
            for lid in lids:
                page = self._take_page(owner)
                self._phys[owner][lid] = page
                out[owner].append(page)
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
        self._phys[owner].update(zip(lids, pages))
        return pages

    def free(self, owner: str, lids: Iterable[int]) -> None:
        """Return the pages of these logical ids (each must be backed)."""
        pop = self._phys[owner].pop
        try:
            pages = [pop(lid) for lid in lids]
        except KeyError as e:
            raise ArenaError(f"{owner}: logical block {e.args[0]} freed but it holds no page") from None
        self._give_back_pages(owner, pages)

    def free_one(self, owner: str, lid: int) -> None:
        """:meth:`free` of one logical id (a request's partly written last block, its state page)."""
        page = self._phys[owner].pop(lid, None)
        if page is None:
            raise ArenaError(f"{owner}: logical block {lid} freed but it holds no page")
        self._give_back(owner, page)

    # ---- pages without a logical id (a step's SWA blocks that leave the window in that step) ----
    def take_unmapped(self, owner: str, n: int) -> list[int]:
        """``n`` pages of ``owner`` held without a logical id, all or nothing (:class:`ArenaEmpty`,
        changing nothing). They count as used until :meth:`give_back_unmapped` returns them or
        :meth:`map_unmapped` gives them ids. Here each is kept in the map under the key
        ``-1 - page`` (never a logical id), so arenas that count the map count them as used."""
        if not self.can_alloc_one(owner, n):
            counts = {SWA: 0, COMPRESS: 0, STATE: 0}
            counts[owner] = n
            raise ArenaEmpty(self._shortfall(counts[SWA], counts[COMPRESS], counts[STATE]))
        pages = self._take_pages(owner, n)
        self._phys[owner].update({-1 - page: page for page in pages})
        return pages

    def map_unmapped(self, owner: str, lids: Sequence[int], pages: Sequence[int]) -> None:
        """Unmapped pages ``pages`` (from :meth:`take_unmapped`) become the pages of fresh logical ids
        ``lids`` (same order)."""
        phys = self._phys[owner]
        for page in pages:
            del phys[-1 - page]
        phys.update(zip(lids, pages))

    def give_back_unmapped(self, owner: str, pages: list[int]) -> None:
        """Return unmapped pages (from :meth:`take_unmapped`) to the free lists."""
        phys = self._phys[owner]
        for page in pages:
            del phys[-1 - page]
        self._give_back_pages(owner, pages)

    def num_unmapped(self, owner: str) -> int:
        """Pages of ``owner`` held without a logical id."""
        return sum(1 for key in self._phys[owner] if key < 0)

    def spare_pages(self, owner: str) -> list[int]:
        """Pages given back unmapped that the arena keeps to lend again first (none here: they go
        straight back to the free pages)."""
        return []

    def _check_maps(self) -> None:
        for owner, phys in self._phys.items():
            pages = list(phys.values())
            assert len(set(pages)) == len(pages), f"{owner}: two logical ids share a page"
