"""One owner's logical blocks: reference counts, the prefix-cache index, and eviction.

Kept apart from the block manager because both the compressed pool and the SWA pool use exactly
this mechanism; their policies (window freeing, retention pins, bounded hits) sit on top.

Every id is in exactly one state::

    vacant  - ref 0, no hash, no arena page          (stack: lowest id first)
    used    - ref > 0, has a page                    (held by sequences and/or a pin)
    cached  - ref 0, has a page and a hash           (LRU order; evicted lazily, only for room)

Eviction is lazy: a released block keeps its page and hash until its memory is needed. Victims are
chosen chunk-aware: among the least recently used cached blocks, the one whose chunk has the fewest
pages in use (so chunks drain and can be lent to the other owner), and :meth:`reclaim_chunk` frees a
whole chunk whose every used page is cached.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable

from atom.model_engine.kv_block import Block
from atom.model_engine.unified_kv_arena import UnifiedKvArena

__all__ = ["BlockPool"]

_LRU_WINDOW = 8  # how many of the oldest cached blocks the chunk-aware victim choice looks at
_EVICTED_MEMORY = 1 << 16  # hashes remembered after eviction, for miss attribution


class BlockPool:
    """Logical ids of one arena owner, with a hash index over the published ones."""

    def __init__(self, owner: str, arena: UnifiedKvArena, num_ids: int) -> None:
        self.owner = owner
        self.arena = arena
        self.blocks = [Block(i) for i in range(num_ids)]
        self._vacant: list[int] = list(range(num_ids - 1, -1, -1))
        self._cached: OrderedDict[int, None] = OrderedDict()
        self._cached_by_chunk: dict[int, set[int]] = {}
        self._hash_to_id: dict[int, int] = {}
        self.evicted_hashes: OrderedDict[int, None] = OrderedDict()
        self.num_evictions = 0
        # recompute tokens a cached block saves (the owner's policy; None: all equal, plain LRU)
        self.unlock_tokens: Callable[[int], int] | None = None
        self._clock = 0
        self.on_evict: Callable[[int], None] = lambda block_hash: None

    # ---- queries ------------------------------------------------------------------------------
    @property
    def num_ids(self) -> int:
        return len(self.blocks)

    def num_cached(self) -> int:
        return len(self._cached)

    def num_used(self) -> int:
        return self.num_ids - len(self._vacant) - len(self._cached)

    def page(self, block_id: int) -> int:
        return self.arena.page(self.owner, block_id)

    def lookup(self, block_hash: int, token_ids: tuple[int, ...]) -> int | None:
        """The published block with this hash *and* these token ids, else None."""
        bid = self._hash_to_id.get(block_hash)
        if bid is None or self.blocks[bid].token_ids != token_ids:
            return None
        return bid

    def is_published(self, block_hash: int) -> bool:
        """Whether a block with this hash is published (used or cached)."""
        return block_hash in self._hash_to_id

    def is_cached(self, block_id: int) -> bool:
        return block_id in self._cached

    # ---- allocation ---------------------------------------------------------------------------
    def allocate(self, n: int) -> list[int]:
        """``n`` fresh blocks with pages, ref 1 each. The caller has made room in the arena;
        raises :class:`ArenaEmpty` (changing nothing) if it did not."""
        if n == 0:
            return []
        ids = self._vacant[-n:][::-1]
        self.arena.alloc(**{self.owner: ids})
        del self._vacant[-n:]
        for bid in ids:
            self.blocks[bid].ref_count = 1
        return ids

    def claim(self, block_id: int) -> None:
        """Take one more reference to a used or cached block."""
        block = self.blocks[block_id]
        if block.ref_count == 0:
            assert block_id in self._cached, f"{self.owner}: claim of vacant block {block_id}"
            self._uncache(block_id)
        block.ref_count += 1

    def release(self, block_id: int, keep: bool = True) -> None:
        """Drop one reference. At ref 0 a published block is kept cached (``keep``) or evicted;
        an unpublished one is freed at once."""
        block = self.blocks[block_id]
        assert block.ref_count > 0, f"{self.owner}: release of block {block_id} with ref 0"
        block.ref_count -= 1
        if block.ref_count:
            return
        if keep and block.block_hash is not None:
            self._cache(block_id)
        else:
            self._free(block_id)

    def publish(self, block_id: int, block_hash: int, token_ids: tuple[int, ...]) -> bool:
        """Index a fully written block under its hash. False if that hash is already published
        (another sequence computed the same block first; this copy stays private)."""
        block = self.blocks[block_id]
        assert block.ref_count > 0, f"{self.owner}: publish of unheld block {block_id}"
        if block.block_hash is not None:
            return block.block_hash == block_hash
        if block_hash in self._hash_to_id:
            return False
        block.block_hash, block.token_ids = block_hash, token_ids
        self._hash_to_id[block_hash] = block_id
        return True

    # ---- eviction -----------------------------------------------------------------------------
    def evict(self, block_id: int) -> None:
        """Drop a cached block from the index and return its page to the arena."""
        assert block_id in self._cached, f"{self.owner}: evict of non-cached block {block_id}"
        block_hash = self.blocks[block_id].block_hash
        self._uncache(block_id)
        self._free(block_id)
        self.num_evictions += 1
        self.on_evict(block_hash)

    def evict_lru(self) -> bool:
        """Evict one cached block among the oldest few: the one worth least (recompute tokens it
        saves / its age in cache events, when the owner's policy values blocks), then the one whose
        chunk has the fewest pages in use (so chunks drain). False if none is cached."""
        if not self._cached:
            return False
        candidates = []
        for bid in self._cached:
            candidates.append(bid)
            if len(candidates) == _LRU_WINDOW:
                break
        used = self.arena.chunk_used_pages
        victim = min(candidates, key=lambda b: (self._worth(b), used(self.owner, self.page(b))))
        self.evict(victim)
        return True

    def _worth(self, block_id: int) -> float:
        if self.unlock_tokens is None:
            return 0.0
        tokens = self.unlock_tokens(block_id)
        return tokens / (self._clock - self.blocks[block_id].cached_at) if tokens else 0.0

    def reclaim_chunk(self) -> bool:
        """Evict every cached block of the least recently used chunk whose used pages are all
        cached, returning that chunk to the arena. False (evicting nothing) if no chunk qualifies."""
        for bid in self._cached:
            chunk = self.arena.chunk_of(self.owner, self.page(bid))
            members = self._cached_by_chunk[chunk]
            if len(members) == self.arena.chunk_used_pages(self.owner, self.page(bid)):
                for victim in list(members):
                    self.evict(victim)
                return True
        return False

    def kept_after_eviction(self, releasable: list[int]) -> tuple[int, int]:
        """(pages, chunks) this owner would still hold if every cached block and every block of
        ``releasable`` (held only by a retention pin) were evicted. Costs O(chunks with cached pages)."""
        extra: dict[int, int] = {}
        for bid in releasable:
            chunk = self.arena.chunk_of(self.owner, self.page(bid))
            extra[chunk] = extra.get(chunk, 0) + 1
        drained = 0
        for chunk in self._cached_by_chunk.keys() | extra.keys():
            gone = len(self._cached_by_chunk.get(chunk, ())) + extra.get(chunk, 0)
            drained += gone == self.arena.chunk_pages_used(self.owner, chunk)
        pages = self.arena.num_used(self.owner) - len(self._cached) - len(releasable)
        return pages, self.arena.owned_chunks(self.owner) - drained

    def unpublish_all_cached(self) -> int:
        """Evict every cached block (``reset_prefix_cache``); returns how many."""
        ids = list(self._cached)
        for bid in ids:
            self.evict(bid)
        return len(ids)

    # ---- internals ----------------------------------------------------------------------------
    def _cache(self, block_id: int) -> None:
        self._cached[block_id] = None
        self.blocks[block_id].cached_at = self._clock
        self._clock += 1
        chunk = self.arena.chunk_of(self.owner, self.page(block_id))
        self._cached_by_chunk.setdefault(chunk, set()).add(block_id)

    def _uncache(self, block_id: int) -> None:
        del self._cached[block_id]
        chunk = self.arena.chunk_of(self.owner, self.page(block_id))
        members = self._cached_by_chunk[chunk]
        members.discard(block_id)
        if not members:
            del self._cached_by_chunk[chunk]

    def _free(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.block_hash is not None:
            del self._hash_to_id[block.block_hash]
            self.evicted_hashes[block.block_hash] = None
            if len(self.evicted_hashes) > _EVICTED_MEMORY:
                self.evicted_hashes.popitem(last=False)
        self.arena.free(self.owner, [block_id])
        block.reset()
        self._vacant.append(block_id)

    def check_integrity(self, holders: dict[int, int] | None = None) -> None:
        """Every id in exactly one state; index and chunk sets consistent. ``holders`` (id -> number
        of sequence references, pins included) is checked against ref counts when given."""
        vacant, cached = set(self._vacant), set(self._cached)
        assert len(vacant) == len(self._vacant), f"{self.owner}: vacant id listed twice"
        assert not vacant & cached, f"{self.owner}: id both vacant and cached"
        for block in self.blocks:
            bid, backed = block.block_id, self.arena.is_backed(self.owner, block.block_id)
            if bid in vacant:
                assert block.ref_count == 0 and block.block_hash is None and not backed, f"{self.owner}: dirty vacant {bid}"
            elif bid in cached:
                assert block.ref_count == 0 and block.block_hash is not None and backed, f"{self.owner}: bad cached {bid}"
            else:
                assert block.ref_count > 0 and backed, f"{self.owner}: used block {bid} ref {block.ref_count}"
            if block.block_hash is not None:
                assert self._hash_to_id.get(block.block_hash) == bid, f"{self.owner}: index misses {bid}"
            if holders is not None:
                assert block.ref_count == holders.get(bid, 0), \
                    f"{self.owner}: block {bid} ref {block.ref_count} but {holders.get(bid, 0)} holders"
        assert len(self._hash_to_id) == sum(b.block_hash is not None for b in self.blocks)
        by_chunk = {}
        for bid in cached:
            by_chunk.setdefault(self.arena.chunk_of(self.owner, self.page(bid)), set()).add(bid)
        assert by_chunk == self._cached_by_chunk, f"{self.owner}: cached-by-chunk index out of date"

