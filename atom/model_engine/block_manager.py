"""BlockManager: the prefix cache and every block a request holds, over one elastic arena.

It owns the arena (``.arena``), the compressed block pool, the SWA pool (``.swa``) and the live
compressor-state pages (``.slots``, pages of the arena's ``state`` owner). Per request it

- matches the prompt against the prefix cache (compressed hit, bounded by the SWA window and the
  captured CSA state), and claims the hit blocks;
- grows the request's tables before each step (new compressed blocks, SWA pages for every block the
  step touches, and at admission its compressor-state page), making room by eviction when the arena
  is short;
- after each step publishes fully written blocks and releases SWA blocks that left the window;
- frees everything when the request ends or is preempted.

Making room (``_make_room``): for an owner that is short of pages, first evict its own least
recently used cached block (chunk-aware); if it has none, reclaim a whole chunk from the other
owner's cache; then release the least recently used retention pin (so pins never starve live
requests); if nothing is left, raise :class:`ArenaEmpty` (the scheduler preempts or waits).
Nothing is evicted unless it helps: a chunk is reclaimed only when every used page of it is cached,
and only from an arena that lends between owners. (``arena`` may be injected: the trace simulator
runs the same block manager over a fixed split or an ATOM-style arena to compare them.)
"""

from __future__ import annotations

from dataclasses import dataclass

from atom.config import CacheConfig
from atom.model_engine.block_pool import BlockPool
from atom.model_engine.chunk_arena import ArenaEmpty
from atom.model_engine.kv_layout import KvLayout
from atom.model_engine.outputs import TableUpdate
from atom.model_engine.sequence import Sequence
from atom.model_engine.state_slots import StatePages
from atom.model_engine.swa_pool import SlidingWindowPool
from atom.model_engine.unified_kv_arena import COMPRESS, STATE, SWA, UnifiedKvArena

__all__ = ["BlockManager", "PrefixMatch", "PrefixCounters"]


@dataclass(frozen=True, slots=True)
class PrefixMatch:
    """Blocks a prompt can reuse, and why it cannot reuse more (in blocks)."""

    blocks: int  # the hit: blocks 0 .. blocks-1 are reused
    compressed: int  # contiguous compressed blocks found
    evicted: int  # further blocks whose compressed KV was cached once but evicted
    window_bound: int  # the compressed hit bounded by a cached SWA window


@dataclass(slots=True)
class PrefixCounters:
    """Totals over admitted requests (tokens), for metrics."""

    queries: int = 0
    hits: int = 0
    lost_to_evicted_kv: int = 0
    lost_to_swa_window: int = 0
    lost_to_csa_state: int = 0
    waits_for_prefix: int = 0  # steps a waiting request waited for a running request to publish its prefix


class BlockManager:
    """Prefix cache + block tables of all requests. Pure Python; the runner never calls it."""

    def __init__(self, layout: KvLayout, cache: CacheConfig, arena: UnifiedKvArena | None = None) -> None:
        spec = layout.spec
        self.block_size = spec.block_size
        if cache.swa_retention_interval % self.block_size:
            raise ValueError(f"swa_retention_interval={cache.swa_retention_interval} must be a multiple "
                             f"of the block size {self.block_size}")
        self.has_compressed = bool(spec.compressed_layers)
        self.prefix_caching = cache.enable_prefix_caching
        self.arena = UnifiedKvArena(layout) if arena is None else arena
        self.comp = BlockPool(COMPRESS, self.arena, layout.max_compressed_pages if self.has_compressed else 0)
        self.swa = SlidingWindowPool(self.arena, spec.sliding_window, cache.swa_full_retain,
                                     cache.swa_retention_interval,
                                     int(cache.swa_pin_fraction * layout.max_swa_pages), bool(spec.csa_layers))
        self.slots = StatePages(self.arena, spec.request_state_bytes > 0)
        self.comp.on_evict = self.swa.unpin_hash
        if self.has_compressed:
            self.swa.compressed_published = self.comp.is_published
        self.swa.on_table_change = lambda seq, idx, page: self.updates.append(TableUpdate(seq.seq_id, SWA, idx, page))
        self.updates: list[TableUpdate] = []
        self.counters = PrefixCounters()
        # hash of a running request's next prompt block to publish -> that request
        self._frontier: dict[int, Sequence] = {}

    # ---- prefix matching ----------------------------------------------------------------------
    def match_prefix(self, seq: Sequence) -> PrefixMatch:
        """What ``seq`` could reuse now (no side effects). The last token always runs."""
        limit = (len(seq) - 1) // self.block_size
        if not self.prefix_caching or limit == 0:
            return PrefixMatch(0, 0, 0, 0)
        hashes = seq.hashes_upto(limit)
        comp = limit
        if self.has_compressed:
            comp = next((j for j in range(limit) if self.comp.lookup(hashes[j], seq.block_tokens(j)) is None), limit)
        evicted = 0
        while comp + evicted < limit and hashes[comp + evicted] in self.comp.evicted_hashes:
            evicted += 1
        window, full = self.swa.bounded_hit(hashes, seq.block_tokens, comp)
        return PrefixMatch(full, comp, evicted, window)

    # ---- admission and growth -----------------------------------------------------------------
    def admit(self, seq: Sequence, max_new: int) -> int:
        """Claim ``seq``'s prefix hit and back its first step of up to ``max_new`` tokens.

        Returns the number of tokens the first step runs, or 0 (changing nothing) when the arena
        cannot make room for its first pages and its compressor-state page.
        """
        match = self.match_prefix(seq)
        self._claim_hit(seq, match.blocks)
        num_new = min(seq.num_remaining, max_new)
        try:
            self.grow(seq, num_new)
        except ArenaEmpty:
            self._release(seq)
            seq.num_computed_tokens = seq.num_cached_tokens = 0
            return 0
        seq.state_fresh = True
        seq.retain_boundaries = self._retain_boundaries(seq, match)
        if seq.num_preemptions == 0:  # a re-admission's hit is mostly its own recompute: count once
            self._count(seq, match)
        if self.prefix_caching:
            self._set_frontier(seq, seq.published_upto, seq.published_upto)
        return num_new

    # ---- burst arrivals: wait for a prefix that a running request is computing -----------------
    def _set_frontier(self, seq: Sequence, old: int, new: int) -> None:
        """Move ``seq``'s entry from prompt block ``old`` to ``new`` (none past its prompt's full
        blocks, or ``new`` < 0: the request is gone). O(1): only the next block is registered."""
        hashes, end = seq.block_hashes, seq.num_prompt_tokens // self.block_size
        if old < min(end, len(hashes)) and self._frontier.get(hashes[old]) is seq:
            del self._frontier[hashes[old]]
        if 0 <= new < end:
            self._frontier.setdefault(seq.hashes_upto(new + 1)[new], seq)

    def should_wait_for_prefix(self, seq: Sequence) -> bool:
        """Whether waiting ``seq`` should stay queued because the next block of its prompt past what
        the cache holds is being computed by a running request: it then waits until that request
        publishes it and hits, instead of computing it again (bounded by that request's prefill).
        The running request keeps its SWA window at the end of the shared run cached for it."""
        if not self._frontier:
            return False
        limit = (len(seq) - 1) // self.block_size
        k = self.match_prefix(seq).compressed
        hashes = seq.hashes_upto(limit)
        producer = self._frontier.get(hashes[k]) if k < limit else None
        if producer is None:
            return False
        theirs, end = producer.block_hashes, k + 1
        while end < min(limit, len(theirs)) and theirs[end] == hashes[end]:
            end += 1
        if end not in producer.retain_boundaries:
            producer.retain_boundaries += (end,)
        self.counters.waits_for_prefix += 1
        return True

    def _retain_boundaries(self, seq: Sequence, match: PrefixMatch) -> tuple[int, ...]:
        """The prompt's last block boundary, plus a shared-prefix junction: the boundary up to which
        the compressed prefix matched an earlier request although its SWA window was gone."""
        prompt_end = (seq.num_prompt_tokens - 1) // self.block_size
        junction = match.compressed if match.compressed > match.window_bound else 0
        return tuple(b for b in {prompt_end, junction} if b > 0)

    def _claim_hit(self, seq: Sequence, blocks: int) -> None:
        seq.reset_blocks()
        for j in range(blocks if self.has_compressed else 0):
            bid = self.comp.lookup(seq.block_hashes[j], seq.block_tokens(j))
            self.comp.claim(bid)
            seq.comp_blocks.append(bid)
            seq.comp_pages.append(self.comp.page(bid))
        self.swa.claim_hit(seq, blocks)
        seq.published_upto = blocks
        seq.num_computed_tokens = seq.num_cached_tokens = blocks * self.block_size

    def _count(self, seq: Sequence, match: PrefixMatch) -> None:
        b, st, c = self.block_size, seq.stats, self.counters
        st.prompt_tokens = len(seq)
        st.reused = match.blocks * b
        st.lost_to_evicted_kv = match.evicted * b
        st.lost_to_swa_window = (match.compressed - match.window_bound) * b
        st.lost_to_csa_state = (match.window_bound - match.blocks) * b
        c.queries += st.prompt_tokens
        c.hits += st.reused
        c.lost_to_evicted_kv += st.lost_to_evicted_kv
        c.lost_to_swa_window += st.lost_to_swa_window
        c.lost_to_csa_state += st.lost_to_csa_state

    def grow(self, seq: Sequence, num_new: int) -> None:
        """Back the next ``num_new`` positions of ``seq``; :class:`ArenaEmpty` if no room.

        Fast path: a step inside one block that is already backed (most decode steps) allocates
        nothing and runs no room check."""
        start = seq.num_computed_tokens
        last = (start + num_new - 1) // self.block_size
        if start // self.block_size == last and last < len(seq.swa_blocks) and seq.swa_blocks[last] >= 0 \
                and (not self.has_compressed or last < len(seq.comp_blocks)) and not self.slots.pages_needed(seq):
            return
        comp_new = 0
        if self.has_compressed:
            comp_new = max(0, -(-(seq.num_computed_tokens + num_new) // self.block_size) - len(seq.comp_blocks))
        swa_new = self.swa.pages_needed(seq, num_new)
        state_new = self.slots.pages_needed(seq)
        self._make_room(swa_new, comp_new, state_new)
        for bid in self.comp.allocate(comp_new):
            seq.comp_blocks.append(bid)
            seq.comp_pages.append(self.comp.page(bid))
            self.updates.append(TableUpdate(seq.seq_id, COMPRESS, len(seq.comp_pages) - 1, seq.comp_pages[-1]))
        self.swa.ensure(seq, num_new)
        if state_new:
            self.slots.take(seq)

    def _make_room(self, swa: int, comp: int, state: int = 0) -> None:
        """Evict until the new pages fit; :class:`ArenaEmpty` (evicting nothing) when even evicting
        every cached block and releasing every pin would not be enough."""
        if self.arena.can_alloc(swa, comp, state):
            return
        if not self._room_possible(swa, comp, state):
            raise ArenaEmpty(f"no room for {swa} SWA + {comp} compressed + {state} state pages even after "
                             "evicting the whole cache")
        pools = {SWA: self.swa.pool, COMPRESS: self.comp}  # the state owner caches nothing
        while not self.arena.can_alloc(swa, comp, state):
            short = [o for o, n in ((SWA, swa), (COMPRESS, comp)) if self.arena.chunks_needed(**{o: n}) > 0]
            if any(pools[o].evict_lru() for o in short):
                continue
            lenders = pools.values() if self.arena.lends_between_owners else ()
            if any(pool.reclaim_chunk() for pool in lenders):
                continue
            released = self.swa.release_oldest_pin()
            assert released, f"room for {swa} SWA + {comp} compressed + {state} state pages was feasible but not reached"

    def _room_possible(self, swa: int, comp: int, state: int) -> bool:
        """Whether evicting cached blocks (and releasing pins) can make the room: first the cheap
        sufficient test (each owner's own cache), then the exact one (what would stay in use)."""
        if self.arena.can_alloc(max(0, swa - self.swa.pool.num_cached()), max(0, comp - self.comp.num_cached()),
                                state):
            return True
        kept = {SWA: self.swa.pool.kept_after_eviction(self.swa.pin_only_ids()),
                COMPRESS: self.comp.kept_after_eviction([]),
                STATE: (self.arena.num_used(STATE), self.arena.owned_chunks(STATE))}
        return self.arena.fits_after_eviction(swa, comp, state, kept)

    # ---- after a step -------------------------------------------------------------------------
    def after_step(self, seq: Sequence) -> None:
        """``seq.num_computed_tokens`` has advanced: publish full blocks, release the old window."""
        full = seq.num_computed_tokens // self.block_size
        if self.prefix_caching and full > seq.published_upto:
            hashes = seq.hashes_upto(full)
            for j in range(seq.published_upto, full if self.has_compressed else 0):
                self.comp.publish(seq.comp_blocks[j], hashes[j], seq.block_tokens(j))
            self.swa.publish_full(seq, seq.published_upto, full)
            self._set_frontier(seq, seq.published_upto, full)
        seq.published_upto = max(seq.published_upto, full)
        self.swa.release_out_of_window(seq)
        seq.state_fresh = False
        seq.restore_page = -1

    def free(self, seq: Sequence) -> None:
        """Release everything ``seq`` holds (finished, aborted or preempted)."""
        if self._frontier:
            self._set_frontier(seq, seq.published_upto, -1)
        self._release(seq)
        self.slots.give_back(seq)
        seq.reset_blocks()

    def _release(self, seq: Sequence) -> None:
        for j in range(len(seq.comp_blocks) - 1, -1, -1):
            self.comp.release(seq.comp_blocks[j], keep=self.prefix_caching)
        self.swa.release_seq(seq)
        seq.comp_blocks, seq.comp_pages = [], []

    def reset_prefix_cache(self) -> int:
        """Evict every cached block of both pools; returns how many."""
        return self.comp.unpublish_all_cached() + self.swa.pool.unpublish_all_cached()

    def drop_cache(self) -> int:
        """Release every retention pin, then evict every cached block (the last resort that lets a
        lone request start again on an arena holding nothing else); returns blocks evicted."""
        self.swa.release_all_pins()
        return self.reset_prefix_cache()

    def take_updates(self) -> list[TableUpdate]:
        out, self.updates = self.updates, []
        return out

    # ---- integrity ----------------------------------------------------------------------------
    def check_integrity(self, seqs: list[Sequence]) -> None:
        """Conservation of ids, chunks and slots; ref counts equal holders; tables match the arena."""
        comp_holders: dict[int, int] = {}
        swa_holders: dict[int, int] = {bid: 1 for bid in self.swa.pinned_ids()}
        for seq in seqs:
            assert len(seq.comp_blocks) == len(seq.comp_pages) and len(seq.swa_blocks) == len(seq.swa_pages)
            for bid, page in zip(seq.comp_blocks, seq.comp_pages):
                comp_holders[bid] = comp_holders.get(bid, 0) + 1
                assert self.comp.page(bid) == page, f"seq {seq.seq_id}: stale compressed page"
            for bid, page in zip(seq.swa_blocks, seq.swa_pages):
                if bid >= 0:
                    swa_holders[bid] = swa_holders.get(bid, 0) + 1
                    assert self.swa.pool.page(bid) == page, f"seq {seq.seq_id}: stale SWA page"
                else:
                    assert page == -1
        self.comp.check_integrity(comp_holders)
        self.swa.pool.check_integrity(swa_holders)
        self.arena.check_integrity()
        self.slots.check_integrity(seqs)
        assert self.swa.num_pins <= max(self.swa.max_pins, 0)
        running = {id(s) for s in seqs}
        assert all(id(s) in running for s in self._frontier.values()), "frontier of a request not running"
