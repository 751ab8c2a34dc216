"""One owner's logical blocks: reference counts, publication at prefix nodes, and eviction.

Kept apart from the block manager because both the compressed pool and the SWA pool use exactly
this mechanism; their policies (window freeing, retention pins, bounded hits) sit on top.

Every id is in exactly one state::

    vacant  - ref 0, no prefix node, no arena page   (stack: lowest id first)
    used    - ref > 0, has a page                    (held by requests and/or a pin)
    cached  - ref 0, has a page and a prefix node    (LRU order; evicted lazily, only for room)

A published block hangs on its prefix node (:mod:`atom.kv.prefix_index`: an integer id, the verified
prefix it was computed under). Per-id state is kept in flat lists (``ref``, ``node``, ``pages``,
...) and every per-request operation has a batched form (:meth:`allocate`, :meth:`release_many`),
so admitting, growing and freeing a long request costs a few list passes, not a Python object per
block.

Eviction is lazy: a released block keeps its page and node until its memory is needed. Victims are
chosen chunk-aware: among the least recently used cached blocks, the one worth least (the owner's
policy), then the one whose chunk has the fewest pages in use (so chunks drain and can be lent to
the other owner); :meth:`reclaim_chunk` frees a whole chunk whose every used page is cached. The
per-chunk counts of cached pages these need are kept incrementally: a release only inserts the
blocks it caches into the LRU dict and counts how many it inserted; the newest that-many entries of
the dict are added to the counts (one C-level pass) when a count is next read, by a claim or an
eviction of a cached block or a room check; a block that stops being cached is taken off its
chunk's count (counts first, then it leaves the dict, so the uncounted entries are always the
newest ones). Eviction thus never recounts the cache, and a request's end counts
nothing. ``check_integrity`` compares the counts with a recount.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from itertools import islice
from typing import Callable, Collection, Iterable, Sequence

from atom.kv.page_map import LogicalPageMap, Owner
from atom.kv.prefix_index import NO_NODE, PrefixIndex

__all__ = ["BlockPool"]

_LRU_WINDOW = 8  # how many of the oldest cached blocks the chunk-aware victim choice looks at
_EVICTED_MEMORY = 1 << 16  # hashes remembered after eviction, for miss attribution


class BlockPool:
    """Logical ids of one arena owner; published ones hang on nodes of the shared prefix index."""

    def __init__(self, owner: Owner, arena: LogicalPageMap, index: PrefixIndex, num_ids: int) -> None:
        self.owner = owner
        self.arena = arena
        self.index = index
        self._at = index.comp if owner == Owner.COMPRESS else index.swa  # node -> this pool's block there
        self.ref = [0] * num_ids
        self.node = [NO_NODE] * num_ids  # the prefix node each published id hangs on
        self.pages = arena.page_table(owner, num_ids)  # the arena page of each backed id (the arena's own map: read only)
        self.captured = [False] * num_ids  # SWA: the fused CSA boundary state of the block was written
        self.cached_at = [0] * num_ids  # the cache clock when it was last cached (its age for eviction)
        self._vacant: list[int] = list(range(num_ids - 1, -1, -1))
        # cached ids, least recently released first (a dict keeps insertion order; no move-to-end is
        # needed, as a claimed block leaves it; a bulk update is 3x cheaper than an OrderedDict's)
        self._cached: dict[int, None] = {}
        # chunk -> this owner's cached pages in it (no zero entries; a Counter: a missing chunk reads 0),
        # less the newest ``_num_uncounted`` entries of ``_cached``, added when a count is next read
        self._cached_in_chunk: Counter[int] = Counter()
        self._num_uncounted = 0
        self._ppc = arena.pages_per_chunk(owner)
        self.evicted_hashes: OrderedDict[int, None] = OrderedDict()
        self.num_evictions = 0
        self.on_evict: Callable[[int], None] = lambda node: None
        # the host tier's write-back: (block id, its node) of a published block about to be evicted
        self.write_back: Callable[[int, int], None] | None = None
        # recompute tokens a cached block saves (the owner's policy; None: all equal, plain LRU)
        self.unlock_tokens: Callable[[int], int] | None = None
        self._clock = 0

    # ---- queries ------------------------------------------------------------------------------
    @property
    def num_ids(self) -> int:
        return len(self.ref)

    def num_cached(self) -> int:
        return len(self._cached)

    def num_used(self) -> int:
        return self.num_ids - len(self._vacant) - len(self._cached)

    def page(self, block_id: int) -> int:
        page = self.pages[block_id]
        assert page >= 0, f"{self.owner} block {block_id} has no arena page"
        return page

    def published_at(self, node: int) -> int | None:
        """This pool's block published at ``node``, else None."""
        bid = self._at[node]
        return None if bid < 0 else bid

    def is_cached(self, block_id: int) -> bool:
        return block_id in self._cached

    # ---- allocation ---------------------------------------------------------------------------
    def allocate(self, n: int) -> tuple[list[int], list[int]]:
        """``n`` fresh blocks with pages, ref 1 each: (ids, pages). The caller has made room in the
        arena; raises :class:`ArenaEmpty` (changing nothing) if it did not."""
        if n == 0:
            return [], []
        ids = self._vacant[-n:][::-1]
        pages = self.arena.alloc_ids(self.owner, ids)  # (it maps them: ``self.pages`` is its table)
        del self._vacant[-n:]
        ref = self.ref
        for bid in ids:
            ref[bid] = 1
        return ids, pages

    def bind(self, pages: list[int]) -> list[int]:
        """Fresh blocks, ref 1 each, for pages the arena lent without a logical id
        (:meth:`LogicalPageMap.take_unmapped`), in the same order; returns their ids."""
        n = len(pages)
        if n == 0:
            return []
        ids = self._vacant[-n:][::-1]
        del self._vacant[-n:]
        self.arena.map_unmapped(self.owner, ids, pages)
        ref = self.ref
        for bid in ids:
            ref[bid] = 1
        return ids

    def claim(self, block_id: int) -> None:
        """Take one more reference to a used or cached block."""
        if self.ref[block_id] == 0:
            assert block_id in self._cached, f"{self.owner}: claim of vacant block {block_id}"
            self._uncount(block_id)
            del self._cached[block_id]
        self.ref[block_id] += 1

    def claim_many(self, block_ids: list[int]) -> None:
        """:meth:`claim` of each id (a prefix hit's blocks), in one loop."""
        ref, cached = self.ref, self._cached
        for bid in block_ids:
            r = ref[bid]
            if r == 0:
                assert bid in cached, f"{self.owner}: claim of vacant block {bid}"
                self._uncount(bid)
                del cached[bid]
            ref[bid] = r + 1

    def release(self, block_id: int, keep: bool = True) -> None:
        """Drop one reference. At ref 0 a published block is kept cached (``keep``) or evicted;
        an unpublished one is freed at once."""
        self.release_many([block_id], keep)

    def release_many(self, block_ids: Iterable[int], keep: bool = True) -> None:
        """:meth:`release` of each id, in order (the earlier ones become the older cache entries);
        ``block_ids`` is read once."""
        ref = self.ref
        if not keep:
            gone = []
            for bid in block_ids:
                r = ref[bid] - 1
                ref[bid] = r
                if not r:
                    gone.append(bid)  # (a ref below 0 fails check_integrity)
            if gone:
                self._free_many(gone)
            return
        nodes, cached, unpublished = self.node, self._cached, []
        before = len(cached)
        for bid in block_ids:  # one pass: drop the reference, cache the published ids it was the last of
            r = ref[bid] - 1
            ref[bid] = r
            if not r:  # (``x.append`` in place: the interpreter specializes it, not a bound-method local)
                if nodes[bid] < 0:
                    unpublished.append(bid)
                else:
                    cached[bid] = None  # (a used id is never cached already)
        if len(unpublished) == 1:  # (a request's partly written last block: inlined, one call less)
            bid = unpublished[0]
            self.arena.free_one(self.owner, bid)
            self.captured[bid] = False
            self._vacant.append(bid)
        elif unpublished:
            self._free_unpublished(unpublished)
        kept = len(cached) - before
        if not kept:
            return
        self._num_uncounted += kept  # counted per chunk when a count is next read (_counts)
        if self.unlock_tokens is not None:  # only a valuing policy reads the age
            at, clock = self.cached_at, self._clock
            if kept == 1:  # (a request's end or a window's step: one block cached, the newest entry)
                at[next(reversed(cached))] = clock
                self._clock = clock + 1
                return
            for bid in reversed(list(islice(reversed(cached), kept))):  # in release order
                at[bid] = clock
                clock += 1
            self._clock = clock
        else:
            self._clock += kept

    def _counts(self) -> Counter[int]:
        """The per-chunk cached page counts, first adding the blocks cached since the last read (the
        newest entries of the LRU dict, in one C-level pass). Releases only insert and count: a
        request's end does not count its pages per chunk, and the counting is done at most once per
        cached block, by the first eviction or claim of a cached block (or a room check) that reads
        the counts. A block leaves the dict only after this ran (:meth:`_uncount`)."""
        n = self._num_uncounted
        if n:
            newest = map(self.pages.__getitem__, islice(reversed(self._cached), n))
            self._cached_in_chunk.update(map(self._ppc.__rfloordiv__, newest))  # (page // ppc: its chunk)
            self._num_uncounted = 0
        return self._cached_in_chunk

    def cached_pages_per_chunk(self) -> dict[int, int]:
        """Chunk -> this owner's cached pages in it (chunks holding none are absent)."""
        return dict(self._counts())

    def publish(self, block_id: int, node: int) -> bool:
        """Publish a fully written block at its prefix node. False if the node already has a block
        of this pool (another request computed the same block first; this copy stays private)."""
        assert self.ref[block_id] > 0, f"{self.owner}: publish of unheld block {block_id}"
        have = self.node[block_id]
        if have >= 0:
            return have == node
        if self._at[node] >= 0:
            return False
        self.node[block_id] = node
        self._at[node] = block_id
        self.index.refs[node] += 1
        return True

    def publish_run(self, block_ids: Sequence[int], nodes: Sequence[int]) -> None:
        """:meth:`publish` of ``block_ids[i]`` at ``nodes[i]`` for each i (a compressed run after a
        step), in one loop; a block already published, or a node holding another block of this pool,
        is skipped as :meth:`publish` skips it."""
        own, ref, at, refs = self.node, self.ref, self._at, self.index.refs
        for bid, node in zip(block_ids, nodes):
            assert ref[bid] > 0, f"{self.owner}: publish of unheld block {bid}"
            if own[bid] >= 0 or at[node] >= 0:
                continue
            own[bid] = node
            at[node] = bid
            refs[node] += 1

    # ---- eviction -----------------------------------------------------------------------------
    def evict(self, block_id: int) -> None:
        """Drop a cached block from the index and return its page to the arena."""
        assert block_id in self._cached, f"{self.owner}: evict of non-cached block {block_id}"
        self._uncount(block_id)
        del self._cached[block_id]
        if self.write_back is not None:
            self.write_back(block_id, self.node[block_id])
        self.on_evict(self.node[block_id])
        self._free_many([block_id])
        self.num_evictions += 1

    def evict_lru(self, skip: Collection[int] = ()) -> bool:
        """Evict one cached block among the oldest few: the one worth least (recompute tokens it
        saves / its age in cache events, when the policy values blocks), then the one whose chunk
        has the fewest pages in use (so chunks drain). Blocks in ``skip`` are passed over. False if
        none is cached (but those)."""
        if len(self._cached) <= len(skip) and all(bid in skip for bid in self._cached):
            return False
        candidates = []
        for bid in self._cached:
            if bid in skip:
                continue
            candidates.append(bid)
            if len(candidates) == _LRU_WINDOW:
                break
        used, pages = self.arena.chunk_used_pages, self.pages
        victim = min(candidates, key=lambda b: (self._worth(b), used(self.owner, pages[b])))
        self.evict(victim)
        return True

    def _worth(self, block_id: int) -> float:
        if self.unlock_tokens is None:
            return 0.0
        tokens = self.unlock_tokens(block_id)
        return tokens / (self._clock - self.cached_at[block_id]) if tokens else 0.0

    def _uncount(self, block_id: int) -> None:
        """``block_id`` stops being cached: one cached page fewer in its chunk (called while it is
        still in ``_cached``, so that :meth:`_counts` counts the newest entries right)."""
        counts, chunk = self._counts(), self.pages[block_id] // self._ppc
        n = counts[chunk] - 1
        if n:
            counts[chunk] = n
        else:
            del counts[chunk]

    def _recount_cached_per_chunk(self) -> dict[int, int]:
        """The per-chunk cached page counts, counted from scratch (``check_integrity``'s reference)."""
        out: dict[int, int] = {}
        for bid in self._cached:
            chunk = self.pages[bid] // self._ppc
            out[chunk] = out.get(chunk, 0) + 1
        return out

    def reclaim_chunk(self, skip: Collection[int] = ()) -> bool:
        """Evict every cached block of the least recently used chunk whose used pages are all
        cached, returning that chunk to the arena; chunks holding a block of ``skip`` do not
        qualify. False (evicting nothing) if no chunk qualifies. Costs O(chunks holding cached
        pages) when none qualifies; else the cached blocks up to the chosen chunk's last are read
        once, in LRU order (which is also the order they are evicted in)."""
        counts, used, owner = self._counts(), self.arena.chunk_pages_used, self.owner
        drainable = {chunk for chunk, n in counts.items() if n == used(owner, chunk)}
        if skip:
            drainable -= {self.pages[bid] // self._ppc for bid in skip}
        if not drainable:
            return False
        pages, ppc, victims, chunk = self.pages, self._ppc, [], -1
        for bid in self._cached:
            c = pages[bid] // ppc
            if chunk < 0 and c in drainable:
                chunk = c
            if c == chunk:
                victims.append(bid)
                if len(victims) == counts[chunk]:
                    break
        for victim in victims:
            self.evict(victim)
        return True

    def kept_after_eviction(self, releasable: list[int], held: list[int] = ()) -> tuple[int, int]:
        """(pages, chunks) this owner would still hold if every cached block except those of ``held``
        (cached blocks about to be claimed) and every block of ``releasable`` (held only by a
        retention pin) were evicted. Costs O(chunks holding cached pages + len(releasable) + len(held))."""
        chunk_of = self._ppc.__rfloordiv__
        gone = Counter(map(chunk_of, map(self.pages.__getitem__, releasable)))
        gone.update(self._counts())
        if held:
            gone.subtract(map(chunk_of, map(self.pages.__getitem__, held)))
        used, owner = self.arena.chunk_pages_used, self.owner
        drained = sum(n == used(owner, chunk) for chunk, n in gone.items())
        pages = self.arena.num_used(self.owner) - len(self._cached) - len(releasable) + len(held)
        return pages, self.arena.owned_chunks(self.owner) - drained

    def unpublish_all_cached(self) -> int:
        """Evict every cached block (``reset_prefix_cache``); returns how many."""
        ids = list(self._cached)
        for bid in ids:
            self.evict(bid)
        return len(ids)

    # ---- internals ----------------------------------------------------------------------------
    def _free_many(self, block_ids: list[int]) -> None:
        """Unpublish (ref 0) blocks and return their pages to the arena."""
        nodes, at, evicted, hash_of = self.node, self._at, self.evicted_hashes, self.index.block_hash
        if max(map(nodes.__getitem__, block_ids)) >= 0:  # (windows leave unpublished)
            for bid in block_ids:
                node = nodes[bid]
                if node >= 0:
                    nodes[bid] = NO_NODE
                    at[node] = -1
                    evicted[hash_of[node]] = None
                    self.index.unref(node)
            while len(evicted) > _EVICTED_MEMORY:
                evicted.popitem(last=False)
        self._free_unpublished(block_ids)

    def _free_unpublished(self, block_ids: list[int]) -> None:
        """Return the pages of blocks at ref 0 that hang on no prefix node to the arena."""
        if len(block_ids) == 1:  # (a request's partly written last block)
            bid = block_ids[0]
            self.arena.free_one(self.owner, bid)
            self.captured[bid] = False
            self._vacant.append(bid)
            return
        self.arena.free_ids(self.owner, block_ids)
        captured = self.captured
        for bid in block_ids:
            captured[bid] = False
        self._vacant += block_ids

    def check_integrity(self, holders: dict[int, int] | None = None) -> None:
        """Every id in exactly one state; nodes point back. ``holders`` (id -> number of request
        references, pins included) is checked against ref counts when given."""
        vacant, cached = set(self._vacant), set(self._cached)
        assert self.cached_pages_per_chunk() == self._recount_cached_per_chunk(), \
            f"{self.owner}: per-chunk cached page counts drifted from a recount"
        assert len(vacant) == len(self._vacant), f"{self.owner}: vacant id listed twice"
        assert not vacant & cached, f"{self.owner}: id both vacant and cached"
        for bid in range(self.num_ids):
            ref, node, backed = self.ref[bid], self.node[bid], self.pages[bid] >= 0
            if bid in vacant:
                assert ref == 0 and node < 0 and not backed and self.pages[bid] == -1, f"{self.owner}: dirty vacant {bid}"
            elif bid in cached:
                assert ref == 0 and node >= 0 and backed, f"{self.owner}: bad cached {bid}"
            else:
                assert ref > 0 and backed, f"{self.owner}: used block {bid} ref {ref}"
            if node >= 0:
                assert self._at[node] == bid, f"{self.owner}: node {node} does not point back at {bid}"
            if holders is not None:
                assert ref == holders.get(bid, 0), f"{self.owner}: block {bid} ref {ref} but {holders.get(bid, 0)} holders"
