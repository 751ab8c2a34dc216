"""The elastic KV arena: two owners (SWA and compressed) borrowing chunks of one byte buffer.

``UnifiedKvArena`` maps each owner's *logical* block ids (what the block manager hashes and
shares) to *physical* pages (what the kernels address, see :mod:`atom.model_engine.kv_layout`).
It knows only used vs free: which blocks stay cached, which are evicted, and when to lend is the
pools' policy. Allocation is all-or-nothing: a request for several blocks of one or both owners
either gets every page or changes nothing.

Owners: ``swa`` (an SWA page = one B-token block of every layer, plus the fused CSA boundary state
of every c4 layer) and ``compress`` (a compressed page = one B-token block of compressed rows and
indexer keys of every compressed layer).
"""

from __future__ import annotations

from atom.model_engine.chunk_arena import ArenaEmpty, ArenaError, ChunkArena, ChunkBackedFreeList
from atom.kv_group import group_of_ratio
from atom.model_engine.kv_layout import ArenaGroupSpec, KvLayout
from atom.model_engine.page_map import COMPRESS, OWNERS, SWA, LogicalPageMap

__all__ = ["SWA", "COMPRESS", "OWNERS", "UnifiedKvArena", "ArenaGroupSpec", "group_of_ratio",
           "ArenaEmpty", "ArenaError", "LogicalPageMap"]


class UnifiedKvArena(LogicalPageMap):
    """Logical->physical page maps for both owners over one :class:`ChunkArena`."""

    def __init__(self, layout: KvLayout) -> None:
        super().__init__()
        self.layout = layout
        self.chunks = ChunkArena(layout.num_chunks)
        self._lists = {
            SWA: ChunkBackedFreeList(self.chunks, layout.chunk_pages, SWA),
            COMPRESS: ChunkBackedFreeList(self.chunks, max(1, layout.compress_pages_per_chunk), COMPRESS),
        }

    # ---- queries ------------------------------------------------------------------------------
    def pages_per_chunk(self, owner: str) -> int:
        return self._lists[owner].pages_per_chunk

    def num_used(self, owner: str) -> int:
        return self._lists[owner].num_used()

    def num_free_chunks(self) -> int:
        return self.chunks.num_free()

    def owned_chunks(self, owner: str) -> int:
        return len(self._lists[owner].owned_chunks())

    def available(self, owner: str) -> int:
        """Pages this owner can get now without anyone evicting: own free pages + free chunks."""
        return self._lists[owner].available()

    def chunks_needed(self, swa: int = 0, compress: int = 0) -> int:
        """Free chunks an allocation of ``swa`` + ``compress`` new pages would borrow."""
        return self._lists[SWA].chunks_needed(swa) + self._lists[COMPRESS].chunks_needed(compress)

    def can_alloc(self, swa: int = 0, compress: int = 0) -> bool:
        return self.chunks_needed(swa, compress) <= self.chunks.num_free()

    def chunk_used_pages(self, owner: str, page: int) -> int:
        """Pages in use in the chunk holding ``page`` (for chunk-aware eviction)."""
        lst = self._lists[owner]
        return lst.used_in_chunk(page // lst.pages_per_chunk)

    def chunk_of(self, owner: str, page: int) -> int:
        return page // self._lists[owner].pages_per_chunk

    @property
    def lends_between_owners(self) -> bool:
        """Whether a chunk one owner frees can be borrowed by the other (True: one shared arena).
        Pools use it to avoid evicting one owner's cache for a shortfall it cannot relieve."""
        return True

    # ---- allocation (maps and all-or-nothing alloc / free: LogicalPageMap) ------------------
    def _shortfall(self, swa: int, compress: int) -> str:
        return (f"need {self.chunks_needed(swa, compress)} free chunks for {swa} SWA + {compress} "
                f"compressed pages; {self.chunks.num_free()} free")

    def _take_page(self, owner: str) -> int:
        return self._lists[owner].pop()

    def _give_back(self, owner: str, page: int) -> None:
        self._lists[owner].free(page)

    # ---- integrity ----------------------------------------------------------------------------
    def check_integrity(self) -> None:
        """Conservation, one owner per chunk, one logical id per page."""
        self.chunks.check_integrity()
        self._check_maps()
        owned: dict[int, str] = {}
        for owner, lst in self._lists.items():
            lst.check_integrity()
            for chunk in lst.owned_chunks():
                assert chunk not in owned, f"chunk {chunk} owned by {owned[chunk]} and {owner}"
                owned[chunk] = owner
            pages = list(self._phys[owner].values())
            assert len(pages) == lst.num_used(), f"{owner}: {len(pages)} mapped vs {lst.num_used()} used pages"
            for page in pages:
                assert lst.owns_chunk(page // lst.pages_per_chunk), f"{owner}: page {page} in a chunk it does not own"
        assert len(owned) + self.chunks.num_free() == self.chunks.num_chunks, "chunks not conserved"

    def usage(self) -> dict[str, int]:
        """Bytes per owner (whole owned chunks) and free, for metrics."""
        cb = self.layout.chunk_bytes
        return {SWA: self.owned_chunks(SWA) * cb, COMPRESS: self.owned_chunks(COMPRESS) * cb,
                "free": self.chunks.num_free() * cb}
