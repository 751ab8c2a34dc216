"""The elastic KV arena: three owners (SWA, compressed, state) borrowing chunks of one byte buffer.

``UnifiedKvArena`` maps each owner's *logical* block ids (what the block manager hashes and
shares) to *physical* pages (what the kernels address, see :mod:`atom.kv.kv_layout`).
It knows only used vs free: which blocks stay cached, which are evicted, and when to lend is the
pools' policy. Allocation is all-or-nothing: a request for several blocks of one or both owners
either gets every page or changes nothing.

Owners: ``swa`` (an SWA page = one B-token block of every layer, plus the fused CSA boundary state
of every c4 layer), ``compress`` (a compressed page = one B-token block of compressed rows and
indexer keys of every compressed layer) and ``state`` (a state page = the live compressor state of
one admitted request, every compressed layer; see :mod:`atom.kv.state_layout`). A chunk
lent to the state owner holds ``layout.state_pages_per_chunk`` whole state pages. With
``layout.reserved_state_slots`` > 0 (the fixed-pool design the benchmarks compare against) the
state owner draws from a pool of that many pages outside the chunks instead.

Pages lent without a logical id (:meth:`take_unmapped`: the SWA blocks of a prefill chunk that leave
the window at the end of its step) are counted, not mapped. When they come back
(:meth:`give_back_unmapped`) they stay *spare*: still used in their owner's free list, and lent first
by the next allocation of that owner (the next chunk takes about as many), so a long prefill moves
its window pages through the free lists once, not once per chunk. A room check counts spare pages
as free (they are lent first); every other query, and a room check that does not fit with them,
first hands them back to the free list, so no caller ever sees a spare page as used.
"""

from __future__ import annotations

from atom.kv.chunk_arena import ChunkArena, ChunkBackedFreeList
from atom.kv.kv_layout import KvLayout
from atom.kv.page_map import COMPRESS, OWNERS, STATE, SWA, LogicalPageMap

# The owner constants (SWA, COMPRESS, STATE, OWNERS) are imported from atom.kv.page_map, their one home.
__all__ = ["UnifiedKvArena"]


class UnifiedKvArena(LogicalPageMap):
    """Logical->physical page maps for the three owners over one :class:`ChunkArena`."""

    def __init__(self, layout: KvLayout) -> None:
        super().__init__()
        self.layout = layout
        self.chunks = ChunkArena(layout.num_chunks)
        reserved = layout.reserved_state_slots
        self._state_pool = ChunkArena(reserved) if reserved else None
        self._lists = {
            SWA: ChunkBackedFreeList(self.chunks, layout.chunk_pages, SWA),
            COMPRESS: ChunkBackedFreeList(self.chunks, max(1, layout.compress_pages_per_chunk), COMPRESS),
            STATE: (ChunkBackedFreeList(self._state_pool, 1, STATE) if self._state_pool is not None else
                    ChunkBackedFreeList(self.chunks, max(1, layout.state_pages_per_chunk), STATE)),
        }
        # pages given back by give_back_unmapped, still used in their owner's free list and lent
        # again first; every other query hands them back to the free list first (_flush_spare)
        self._spare: dict[str, list[int]] = {owner: [] for owner in OWNERS}
        self._num_spare = 0

    # ---- queries ------------------------------------------------------------------------------
    def pages_per_chunk(self, owner: str) -> int:
        return self._lists[owner].pages_per_chunk

    def num_used(self, owner: str) -> int:
        self._flush_spare()
        return self._lists[owner].num_used()

    def num_free_chunks(self) -> int:
        self._flush_spare()
        return self.chunks.num_free()

    def owned_chunks(self, owner: str) -> int:
        self._flush_spare()
        return len(self._lists[owner].owned_chunks())

    def available(self, owner: str) -> int:
        """Pages this owner can get now without anyone evicting: own free pages + free chunks."""
        self._flush_spare()
        return self._lists[owner].available()

    def chunks_needed(self, swa: int = 0, compress: int = 0, state: int = 0) -> int:
        """Free chunks of the shared arena an allocation of ``swa`` + ``compress`` + ``state`` new
        pages would borrow (a reserved state pool lends none)."""
        self._flush_spare()
        return self._chunks_needed(swa, compress, state)

    def _chunks_needed(self, swa: int, compress: int, state: int) -> int:
        lists = self._lists  # (an owner asking for no page needs no chunk: not asked)
        need = (lists[SWA].chunks_needed(swa) if swa else 0) + (lists[COMPRESS].chunks_needed(compress) if compress else 0)
        return need + (lists[STATE].chunks_needed(state) if state and self._state_pool is None else 0)

    def can_alloc(self, swa: int = 0, compress: int = 0, state: int = 0) -> bool:
        """Whether the pages fit now. Spare pages count first: True when the pages fit with them
        (allocations lend them first); otherwise they go back to the free lists and the pages are
        checked against those alone."""
        if self._num_spare:
            spare = self._spare
            s, c, t = swa - len(spare[SWA]), compress - len(spare[COMPRESS]), state - len(spare[STATE])
            if self._fits(s if s > 0 else 0, c if c > 0 else 0, t if t > 0 else 0):  # (no max(): ~1K instructions each)
                return True
            self._flush_spare()
        return self._fits(swa, compress, state)

    def _fits(self, swa: int, compress: int, state: int) -> bool:
        lists = self._lists  # (:meth:`_chunks_needed`, inlined: every room test comes here)
        need = (lists[SWA].chunks_needed(swa) if swa else 0) + (lists[COMPRESS].chunks_needed(compress) if compress else 0)
        if state:
            if self._state_pool is not None:
                if state > lists[STATE].available():
                    return False
            else:
                need += lists[STATE].chunks_needed(state)
        return need <= self.chunks.num_free()

    def can_alloc_one(self, owner: str, n: int) -> bool:
        lst = self._lists[owner]
        n -= len(self._spare[owner])  # (lent first)
        if owner == STATE and self._state_pool is not None:  # a reserved pool lends and borrows nothing
            return n <= lst.available()
        return lst.chunks_needed(n) <= self.chunks.num_free()

    def chunk_used_pages(self, owner: str, page: int) -> int:
        """Pages in use in the chunk holding ``page`` (for chunk-aware eviction)."""
        self._flush_spare()
        lst = self._lists[owner]
        return lst.used_in_chunk(page // lst.pages_per_chunk)

    def chunk_of(self, owner: str, page: int) -> int:
        return page // self._lists[owner].pages_per_chunk

    def chunk_pages_used(self, owner: str, chunk: int) -> int:
        self._flush_spare()
        return self._lists[owner].used_in_chunk(chunk)

    def fits_after_eviction(self, swa: int, compress: int, state: int, kept: dict[str, tuple[int, int]]) -> bool:
        """Each owner keeps only its ``kept`` chunks; what those lack comes from the freed rest
        (a reserved state pool lends nothing and borrows nothing)."""
        self._flush_spare()
        owners = [(SWA, swa), (COMPRESS, compress)]
        if self._state_pool is None:
            owners.append((STATE, state))
        elif state > self._lists[STATE].available():
            return False
        borrow, free = 0, self.chunks.num_chunks
        for owner, n in owners:
            pages, chunks = kept[owner]
            ppc = self._lists[owner].pages_per_chunk
            borrow += max(0, -(-(n - (chunks * ppc - pages)) // ppc))
            free -= chunks
        return borrow <= free

    @property
    def lends_between_owners(self) -> bool:
        """Whether a chunk one owner frees can be borrowed by the other (True: one shared arena).
        Pools use it to avoid evicting one owner's cache for a shortfall it cannot relieve."""
        return True

    # ---- allocation (maps and all-or-nothing alloc / free: LogicalPageMap) ------------------
    def _shortfall(self, swa: int, compress: int, state: int) -> str:
        return (f"need {self.chunks_needed(swa, compress, state)} free chunks for {swa} SWA + {compress} "
                f"compressed + {state} state pages; {self.chunks.num_free()} free")

    def _take_page(self, owner: str) -> int:
        return self._lists[owner].pop()

    def _give_back(self, owner: str, page: int) -> None:
        self._lists[owner].free(page)

    def _take_pages(self, owner: str, n: int) -> list[int]:
        return self._lists[owner].pop_many(n)

    def alloc(self, swa=(), compress=(), state=()) -> dict[str, list[int]]:  # type: ignore[no-untyped-def]
        self._flush_spare()  # (its page takes do not lend spare pages)
        return super().alloc(swa, compress, state)

    def alloc_ids(self, owner: str, lids: list[int]) -> list[int]:
        """:meth:`LogicalPageMap.alloc_ids` with its room check (in :meth:`_take`) and its map writes
        inlined: every allocation of a pool or a state page comes here."""
        spare = self._spare[owner]
        pages = self._take(owner, len(lids)) if spare else self._lists[owner].pop_many(len(lids))  # (no spare: one call less)
        if owner == STATE:
            self._state.update(zip(lids, pages))
        else:
            table = self._tables[owner]
            for lid, page in zip(lids, pages):
                table[lid] = page
        return pages

    def _take(self, owner: str, n: int) -> list[int]:
        """``n`` pages of ``owner``: its spare pages first (the latest given back first), then its
        free list's; :class:`ArenaEmpty` (taking none) when they do not fit."""
        lst, spare = self._lists[owner], self._spare[owner]
        have = len(spare)
        if have >= n:
            pages = spare[have - n:]
            del spare[have - n:]
            self._num_spare -= n
            return pages
        if not have:
            return lst.pop_many(n)  # (ArenaEmpty, taking none, when they do not fit)
        more = lst.pop_many(n - have)  # (first: if it raises, the spare pages stay)
        pages = spare[:]
        spare.clear()
        self._num_spare -= have
        return pages + more

    def take_unmapped(self, owner: str, n: int) -> list[int]:
        """:meth:`LogicalPageMap.take_unmapped`, spare pages first."""
        pages = self._take(owner, n)
        self._unmapped[owner] += n
        return pages

    def give_back_unmapped(self, owner: str, pages: list[int]) -> None:
        """The pages become spare: still used in the free list and lent again first (a prefill
        chunk gives back the pages of the blocks that left the window, the next chunk takes as many
        again), until a query that would see them hands them back to the free list."""
        self._unmapped[owner] -= len(pages)
        self._spare[owner] += pages
        self._num_spare += len(pages)

    def spare_pages(self, owner: str) -> list[int]:
        return list(self._spare[owner])

    def _flush_spare(self) -> None:
        """Give every spare page back to its owner's free list."""
        if self._num_spare:
            for owner, spare in self._spare.items():
                if spare:
                    pages = spare[:]
                    spare.clear()
                    self._give_back_pages(owner, pages)
            self._num_spare = 0

    def _give_back_pages(self, owner: str, pages: list[int]) -> None:
        if len(pages) == 1:  # one call less
            self._lists[owner].free(pages[0])
        else:
            self._lists[owner].free_many(pages)

    # ---- integrity ----------------------------------------------------------------------------
    def check_integrity(self) -> None:
        """Conservation, one owner per chunk, one logical id per page; spare pages are used pages of
        their owner that no logical id maps and no one holds."""
        assert self._num_spare == sum(map(len, self._spare.values())), "spare page count drifted"
        self.chunks.check_integrity()
        self._check_maps()
        owned: dict[int, str] = {}
        for owner, lst in self._lists.items():
            lst.check_integrity()
            if lst.arena is not self.chunks:  # a reserved state pool: its own conservation
                self._state_pool.check_integrity()
                assert len(lst.owned_chunks()) + self._state_pool.num_free() == self._state_pool.num_chunks
            for chunk in lst.owned_chunks() if lst.arena is self.chunks else ():
                assert chunk not in owned, f"chunk {chunk} owned by {owned[chunk]} and {owner}"
                owned[chunk] = owner
            pages = list(self.mapping(owner).values())
            spare = self._spare[owner]
            assert len(pages) + self._unmapped[owner] + len(spare) == lst.num_used(), \
                f"{owner}: {len(pages)} mapped + {self._unmapped[owner]} unmapped + {len(spare)} spare vs " \
                f"{lst.num_used()} used pages"
            assert len(set(spare)) == len(spare) and set(spare).isdisjoint(pages), f"{owner}: a spare page is also used"
            for page in pages + spare:
                assert lst.owns_chunk(page // lst.pages_per_chunk), f"{owner}: page {page} in a chunk it does not own"
        assert len(owned) + self.chunks.num_free() == self.chunks.num_chunks, "chunks not conserved"

    def usage(self) -> dict[str, int]:
        """Bytes per owner (whole owned chunks; a reserved state pool counts whole) and free, for metrics."""
        self._flush_spare()
        cb = self.layout.chunk_bytes
        state = self.layout.state_pool_bytes if self._state_pool is not None else self.owned_chunks(STATE) * cb
        return {SWA: self.owned_chunks(SWA) * cb, COMPRESS: self.owned_chunks(COMPRESS) * cb, STATE: state,
                "free": self.chunks.num_free() * cb}
