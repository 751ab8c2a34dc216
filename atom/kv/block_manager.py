"""BlockManager: the prefix cache and everything a request holds, over one elastic arena.

It owns the arena (``.arena``), the shared prefix index (``.index``), the two block policies
(``.comp``, a :class:`CompressedPool`, and ``.swa``, a :class:`SlidingWindowPool`), the live
compressor-state pages (``.slots``, pages of the arena's ``state`` owner), and one
:class:`KvHoldings` per admitted request (``.holdings``: the only record of what a request holds;
the request itself, a :class:`KvRequest`, keeps tokens and progress). Per request it

- matches the prompt against the prefix cache (a verified chain of prefix nodes: compressed hit,
  bounded by the SWA window and the captured CSA state), and claims the hit blocks;
- grows the request's tables before each step (new compressed blocks, SWA pages for every block the
  step touches, and at admission its compressor-state page), making room by eviction when the arena
  is short; a step that needs no new page (most decode steps) does nothing else;
- after each step publishes fully written blocks and releases SWA blocks that left the window;
- frees everything when the request ends or is preempted.

Every table change goes through :meth:`KvHoldings.write`, which emits the runner's deltas.

Making room (``_make_room``): first check that evicting every cached block and releasing every
retention pin could make the room at all (if not, raise :class:`ArenaEmpty` having evicted
nothing). Then, for an owner that is short of pages, first evict its own least
recently used cached block (chunk-aware); if it has none, reclaim a whole chunk from the other
owner's cache; then release the least recently used retention pin (so pins never starve live
requests). Nothing is evicted unless it helps: a chunk is reclaimed only when every used page of it is cached,
and only from an arena that lends between owners. Growth ``within_pins`` (prefill chunks, sized by
:meth:`BlockManager.admit` and :meth:`BlockManager.chunk_within_pins`) skips the compressed blocks
pinned windows need and releases no pin whenever the room can be made so; ``spare_only`` growth
(speculative drafts) evicts nothing. (``arena`` may be injected: the trace simulator
runs the same block manager over a fixed split or an ATOM-style arena to compare them.)
"""

from __future__ import annotations

from typing import Iterable, NamedTuple, Sequence

from atom.config import CacheConfig
from atom.kv.chunk_arena import ArenaEmpty
from atom.kv.compressed_pool import CompressedPool
from atom.kv import host_tier
from atom.kv.host_pool import HostPool
from atom.kv.kv_block import chain_hashes
from atom.kv.kv_holdings import SCRATCH, KvHoldings
from atom.kv.kv_layout import KvLayout
from atom.kv.tables import HostCopy, NewTables, TableUpdate
from atom.kv.page_map import COMPRESS, STATE, SWA, LogicalPageMap
from atom.kv.pin_guard import longest_fitting_chunk, pinned_prefix_blocks
from atom.kv.prefix_index import NO_NODE, PrefixIndex
from atom.kv.prefix_stats import PrefixStats
from atom.kv.kv_request import KvRequest
from atom.kv.state_slots import StatePages
from atom.kv.swa_pool import SlidingWindowPool
from atom.kv.unified_kv_arena import UnifiedKvArena

__all__ = ["BlockManager", "PrefixMatch"]

_new_tuple = tuple.__new__  # a named tuple from its fields in declaration order, in one C call


class PrefixMatch(NamedTuple):
    """Blocks a prompt can reuse, and why it cannot reuse more (in blocks). A named tuple: one is
    built per admission and per waiting check, and a frozen dataclass's constructor costs several
    times a tuple's."""

    blocks: int  # the hit: blocks 0 .. blocks-1 are reused
    compressed: int  # contiguous compressed blocks found
    evicted: int  # further blocks whose compressed KV was cached once but evicted
    window_bound: int  # the compressed hit bounded by a cached SWA window
    from_host: int = 0  # blocks of the hit past what the device alone holds (restored from the host tier)


class BlockManager:
    """Prefix cache + block tables of all requests. Pure Python; the runner never calls it."""

    def __init__(self, layout: KvLayout, cache: CacheConfig, arena: LogicalPageMap | None = None,
                 mtp_rows: bool = False) -> None:
        """``mtp_rows``: the runner writes and reads the MTP layer's rows in the SWA pages (speculative
        decoding, on a layout that counts the MTP layer); prefix hits then also match the token after
        each hit block (:class:`SlidingWindowPool`)."""
        spec = layout.spec
        if mtp_rows and not spec.num_mtp_layers:
            raise ValueError("mtp_rows=True needs a layout that counts the MTP layer (kv_spec(include_mtp=True))")
        self.block_size = spec.block_size
        if cache.swa_retention_interval % self.block_size:
            raise ValueError(f"swa_retention_interval={cache.swa_retention_interval} must be a multiple "
                             f"of the block size {self.block_size}")
        self.has_compressed = bool(spec.compressed_layers)
        self.prefix_caching = cache.enable_prefix_caching
        self.arena = UnifiedKvArena(layout) if arena is None else arena
        # a node for every block the two pools can publish, made now (the index still grows past it)
        comp_ids = layout.max_compressed_pages if self.has_compressed else 0
        self.index = PrefixIndex(comp_ids + layout.max_swa_pages if self.prefix_caching else 0)
        self.comp = CompressedPool(self.arena, self.index, comp_ids, self.block_size, self.prefix_caching)
        self.swa = SlidingWindowPool(self.arena, self.index, layout.max_swa_pages, self.block_size,
                                     spec.sliding_window, spec.tail_blocks, cache,
                                     int(cache.swa_pin_fraction * layout.max_swa_pages), bool(spec.csa_layers),
                                     self.has_compressed, mtp_rows)
        self.slots = StatePages(self.arena, spec.request_state_bytes > 0)
        self.comp.pool.on_evict = self.swa.unpin_node
        self.host: HostPool | None = host_tier.attach(self, layout, cache)  # the host tier, or None
        # write-through: a hit that claims a node's blocks for this many-th time copies them to the host
        self.write_through_hits = cache.host_kv_write_through_hits \
            if self.host is not None and cache.host_kv_write_policy == "through" else 0
        self.holdings: dict[int, KvHoldings] = {}
        self.updates: list[TableUpdate] = []
        self.counters = PrefixStats()  # totals over admitted requests (first admission only), for metrics
        self.waits_for_prefix = 0  # steps a waiting request waited for a running request to publish its prefix
        # hash of a running request's next prompt block to publish -> (that request, its block hashes)
        self._frontier: dict[int, tuple[int, list[int]]] = {}

    # ---- prefix matching ----------------------------------------------------------------------
    def match_prefix(self, seq: KvRequest) -> PrefixMatch:
        """What ``seq`` could reuse now (no side effects). The last token always runs."""
        return self._match(seq)[0]

    def cached_prefix_tokens(self, token_ids: Sequence[int]) -> int:
        """Tokens of a prompt ``token_ids`` that admitting it now would take from the cache (the hit
        :meth:`admit` counts: whole blocks, bounded by the cached window and the CSA state). Read
        only: it claims nothing and moves nothing in the LRU order, so a router may ask every
        replica about every request."""
        limit = (len(token_ids) - 1) // self.block_size
        if not self.prefix_caching or limit <= 0:
            return 0
        hashes: list[int] = []
        keys: list[bytes] = []
        chain_hashes(token_ids, self.block_size, limit, hashes, keys)
        chain = self.index.chain(hashes, keys, limit)
        comp = self.comp.hit_blocks(chain) if self.has_compressed else len(chain)
        return self.swa.bounded_hit(chain, comp, token_ids)[1] * self.block_size

    def _match(self, seq: KvRequest) -> tuple[PrefixMatch, list[int], list[int]]:
        """(the match, its verified chain of nodes, the compressed block at each node of the chain,
        -1 where none: what :meth:`_admit` claims; empty without compressed layers)."""
        limit = (len(seq.token_ids) - 1) // self.block_size  # (the list's len: no __len__ call)
        if not self.prefix_caching or limit == 0:
            return PrefixMatch(0, 0, 0, 0), [], []
        hashes = seq.hashes_upto(limit)
        chain = self.index.chain(hashes, seq.block_keys, limit)
        if not chain:  # a miss (what follows would find no window and no host copy either)
            evicted = 0
            while evicted < limit and hashes[evicted] in self.comp.pool.evicted_hashes:
                evicted += 1
            return PrefixMatch(0, 0, evicted, 0), chain, []
        comp, comp_ids = self.comp.published(chain) if self.has_compressed else (len(chain), [])
        host = self.host
        if host is not None and self.has_compressed:
            comp_at, host_at = self.index.comp, self.index.host_comp
            both = next((j for j, node in enumerate(chain) if comp_at[node] < 0 and host_at[node] < 0), len(chain))
        else:
            both = comp
        evicted = 0
        while both + evicted < limit and hashes[both + evicted] in self.comp.pool.evicted_hashes:
            evicted += 1
        window, full = self.swa.bounded_hit(chain, comp, seq.token_ids)
        if host is None:
            return PrefixMatch(full, comp, evicted, window), chain, comp_ids
        window_h, full_h = self.swa.bounded_hit(chain, both, seq.token_ids, host.next_token)
        if full_h <= full:
            return PrefixMatch(full, both, evicted, max(window, window_h)), chain, comp_ids
        return PrefixMatch(full_h, both, evicted, window_h, full_h - full), chain, comp_ids

    def published_block(self, owner: str, seq: KvRequest, j: int) -> int | None:
        """The ``owner`` block published for block ``j`` of ``seq``'s exact prefix, else None."""
        chain = self.index.chain(seq.hashes_upto(j + 1), seq.block_keys, j + 1)
        if len(chain) <= j:
            return None
        bid = (self.index.comp if owner == COMPRESS else self.index.swa)[chain[j]]
        return None if bid < 0 else bid

    # ---- admission and growth -----------------------------------------------------------------
    def admit(self, seq: KvRequest, max_new: int) -> int:
        """Claim ``seq``'s prefix hit and back its first step of up to ``max_new`` tokens.

        Returns the number of tokens the first step runs, or 0 (changing nothing: decided before the
        hit is claimed, as a claim and its release would reorder the LRU and the pins) when the arena
        cannot make room for its first pages and its compressor-state page. A first chunk that fits
        only by releasing retention pins is shortened to the longest that fits within them
        (:mod:`pin_guard`), if any.
        """
        return self._admit(seq, max_new, *self._match(seq))

    def admit_unless_waiting(self, seq: KvRequest, max_new: int) -> int | None:
        """:meth:`should_wait_for_prefix`, then (None when it waits) :meth:`admit`, matching the
        prompt against the cache once for both (what a scheduler asks of a waiting request)."""
        match, chain, comp_ids = self._match(seq)
        if self._frontier and self._waits_for(seq, match):
            return None
        return self._admit(seq, max_new, match, chain, comp_ids)

    def _admit(self, seq: KvRequest, max_new: int, match: PrefixMatch, chain: list[int], comp_ids: list[int]) -> int:
        """:meth:`admit` with ``seq``'s prefix match (:meth:`_match`: the match, its chain and the
        compressed block at each node of it) already taken."""
        assert seq.seq_id not in self.holdings, f"request {seq.seq_id} admitted twice"
        start, blocks = match.blocks * self.block_size, match.blocks
        num_new = len(seq.token_ids) - start
        num_new = num_new if num_new < max_new else max_new
        tail = self.swa.tail_blocks
        window = range(blocks - tail if blocks > tail else 0, blocks)
        comp_at, swa_at = self.index.comp, self.index.swa
        comp_ids = comp_ids[:blocks]  # (the blocks a hit of ``blocks`` claims; [] without compressed layers)
        swa_ids = [swa_at[n] for n in chain[window.start:blocks]]
        restore = {COMPRESS: [chain[j] for j in range(blocks) if comp_at[chain[j]] < 0] if self.has_compressed else [],
                   SWA: [chain[j] for j in window if swa_at[chain[j]] < 0]} if match.from_host else None
        extra = (len(restore[SWA]), len(restore[COMPRESS])) if restore else (0, 0)
        first = self._first_pages(blocks, num_new, extra)
        room_now = self.arena.can_alloc(*first)  # (:meth:`_admission_fits`, its first test kept)
        claimed: dict[str, list[int]] = {}  # owner -> the hit's device blocks, listed only when a test reads them
        pins = self.swa.num_pins
        if not room_now or pins or restore:
            claimed = {COMPRESS: [bid for bid in comp_ids if bid >= 0] if -1 in comp_ids else comp_ids,
                       SWA: [bid for bid in swa_ids if bid >= 0]}
        if not room_now and not self._room_possible(*first, claimed):
            return 0
        if pins:
            within = {SWA: claimed[SWA],
                      COMPRESS: pinned_prefix_blocks(self.swa, self.comp.pool).union(claimed[COMPRESS])}
            fitted = longest_fitting_chunk(start, num_new, self.block_size,
                                           lambda m: self._admission_fits(blocks, m, within, True, extra)) or num_new
            room_now, num_new = room_now and fitted == num_new, fitted
        if restore:
            host_tier.restore(self, restore, claimed, self._first_pages(blocks, num_new, extra))
        h = self.holdings[seq.seq_id] = KvHoldings(seq.seq_id, self.updates)
        self._claim_hit(h, chain, blocks, None if restore else (comp_ids, swa_ids))
        h.retain_boundaries = self._retain_boundaries(seq, match)  # (before growth: it decides what is kept)
        seq.num_computed_tokens = seq.num_cached_tokens = start
        if room_now and not restore:  # the pages counted above fit without eviction; claims take none
            self._back(h, start, num_new, *first)
        else:
            self.grow(seq, num_new, within_pins=True)
        h.state_fresh = True
        if seq.num_preemptions == 0:  # a re-admission's hit is mostly its own recompute: count once
            self._count(seq, match)
        if self.prefix_caching:
            self._set_frontier(seq, -1, blocks)  # (from no entry: a new request has none)
        return num_new

    def _admission_fits(self, blocks: int, num_new: int, claimed: dict[str, Iterable[int]],
                        keep_pins: bool = False, extra: tuple[int, int] = (0, 0)) -> bool:
        """Whether claiming a hit of ``blocks`` blocks (its ``claimed`` ids) and backing ``num_new``
        tokens after it would find room (:meth:`grow` after :meth:`_claim_hit`), decided without
        claiming anything: the claimed blocks leave the cache, and a pin they carry is no longer
        releasable (:meth:`_room_possible`). ``extra``: (SWA, compressed) pages of hit blocks restored
        from the host tier, backed together with the first chunk (all or nothing)."""
        swa, comp, state = self._first_pages(blocks, num_new, extra)
        return self.arena.can_alloc(swa, comp, state) or self._room_possible(swa, comp, state, claimed, keep_pins)

    def _first_pages(self, blocks: int, num_new: int, extra: tuple[int, int] = (0, 0)) -> tuple[int, int, int]:
        """(SWA, compressed, state) pages an admission with a hit of ``blocks`` blocks, ``extra`` restored
        pages and a first chunk of ``num_new`` tokens takes."""
        b = self.block_size
        end = blocks * b + num_new
        comp = -(-end // b) - blocks
        comp = (comp if comp > 0 else 0) + extra[1] if self.has_compressed else 0
        return (end - 1) // b - blocks + 1 + extra[0], comp, int(self.slots.has_state)

    def chunk_within_pins(self, seq: KvRequest, num_new: int) -> int:
        """The prefill chunk of running ``seq`` to run instead of ``num_new`` tokens so that backing it
        (``grow(..., within_pins=True)``) touches no retention pin (:mod:`pin_guard`): ``num_new`` when
        it fits so, else the longest chunk ending at a block end that does, else the chunk to the end
        of the current block (the least a step can do; backing it may still release pins, which never
        starve a live request). A large token budget thus never takes a long prompt in one chunk that
        unpins, and then evicts, the checkpoints a small budget keeps."""
        if not self.swa.num_pins:
            return num_new
        h, start, b = self.holdings[seq.seq_id], seq.num_computed_tokens, self.block_size
        protected: set[int] | None = None

        def fits(m: int) -> bool:
            nonlocal protected
            swa, comp = self.swa.pages_needed(h, start, m), self.comp.pages_needed(h, start + m) if self.has_compressed else 0
            state = self.slots.pages_needed(h)
            if self.arena.can_alloc(swa, comp, state):
                return True
            protected = pinned_prefix_blocks(self.swa, self.comp.pool) if protected is None else protected
            return self._room_possible(swa, comp, state, {COMPRESS: protected}, keep_pins=True)
        return longest_fitting_chunk(start, num_new, b, fits) or min(num_new, b - start % b)

    def _claim_hit(self, h: KvHoldings, chain: list[int], blocks: int,
                   ids: tuple[list[int], list[int]] | None = None) -> None:
        """Claim the hit's blocks (a miss claims nothing: the fresh holdings already say so).
        ``ids``: (compressed blocks at ``chain[:blocks]``, SWA blocks of its trailing window) as
        :meth:`_admit` read them from the index, when nothing changed the index since (no host-tier
        restore in between); else the pools read them again."""
        if blocks:
            comp_ids, swa_ids = ids if ids is not None else (None, None)
            if self.has_compressed:
                self.comp.claim_hit(h, chain, blocks, comp_ids)
            self.swa.claim_hit(h, chain, blocks, swa_ids)
            h.published_upto = h.hit_blocks = blocks
            h.tip = chain[blocks - 1]
            self.index.refs[h.tip] += 1  # (PrefixIndex.ref, inlined)
            if self.write_through_hits:
                host_tier.write_through(self, chain, blocks)

    def _retain_boundaries(self, seq: KvRequest, match: PrefixMatch) -> tuple[int, ...]:
        """The prompt's last block boundary, plus a shared-prefix junction: the boundary up to which
        the compressed prefix matched an earlier request although its SWA window was gone."""
        prompt_end = (seq.num_prompt_tokens - 1) // self.block_size
        junction = match.compressed if match.compressed > match.window_bound else 0
        if junction and junction != prompt_end:
            return (prompt_end, junction) if prompt_end > 0 else (junction,)
        return (prompt_end,) if prompt_end > 0 else ()

    def _count(self, seq: KvRequest, match: PrefixMatch) -> None:
        b, st = self.block_size, seq.stats
        st.prompt_tokens = len(seq)
        st.reused = match.blocks * b
        st.lost_to_evicted_kv = match.evicted * b
        st.lost_to_swa_window = (match.compressed - match.window_bound) * b
        st.lost_to_csa_state = (match.window_bound - match.blocks) * b
        st.reused_from_host = match.from_host * b
        self.counters.add(st)
        if self.host is not None:
            self.host.stats.host_hit_tokens += st.reused_from_host

    # ---- burst arrivals: wait for a prefix that a running request is computing -----------------
    def _set_frontier(self, seq: KvRequest, old: int, new: int) -> None:
        """Move ``seq``'s entry from prompt block ``old`` (< 0: it has none) to ``new`` (none past its
        prompt's full blocks, or ``new`` < 0: the request is gone). O(1): only the next block is
        registered."""
        hashes, sid, end = seq.block_hashes, seq.seq_id, seq.num_prompt_tokens // self.block_size
        if 0 <= old < end and old < len(hashes) and self._frontier.get(hashes[old], (None,))[0] == sid:
            del self._frontier[hashes[old]]
        if 0 <= new < end:
            self._frontier.setdefault(seq.hashes_upto(new + 1)[new], (sid, seq.block_hashes))

    def should_wait_for_prefix(self, seq: KvRequest) -> bool:
        """Whether waiting ``seq`` should stay queued because the next block of its prompt past what
        the cache holds is being computed by a running request: it then waits until that request
        publishes it and hits, instead of computing it again (bounded by that request's prefill).
        The running request keeps its SWA window at the end of the shared run cached for it."""
        return bool(self._frontier) and self._waits_for(seq, self._match(seq)[0])

    def _waits_for(self, seq: KvRequest, match: PrefixMatch) -> bool:
        """:meth:`should_wait_for_prefix` given ``seq``'s prefix match."""
        limit = (len(seq.token_ids) - 1) // self.block_size
        k = match.compressed
        hashes = seq.hashes_upto(limit)
        producer, theirs = self._frontier.get(hashes[k], (None, [])) if k < limit else (None, [])
        if producer is None:
            return False
        end = k + 1
        while end < min(limit, len(theirs)) and theirs[end] == hashes[end]:
            end += 1
        h = self.holdings[producer]
        if end not in h.retain_boundaries:
            h.retain_boundaries += (end,)
            self.swa.promote(h, end)  # its step may have backed that window for the step only
        self.waits_for_prefix += 1
        return True

    # ---- growth -------------------------------------------------------------------------------
    def grow(self, seq: KvRequest, num_new: int, spare_only: bool = False, within_pins: bool = False) -> None:
        """Back the next ``num_new`` positions of ``seq``; :class:`ArenaEmpty` (changing nothing) if
        no room. ``spare_only``: use only pages the arena has spare, evicting no cached block and
        releasing no retention pin (speculative drafts are backed this way). ``within_pins``: make the
        room without touching a retention pin when that is possible (prefill chunks, sized by
        :meth:`admit` and :meth:`chunk_within_pins`), else as usual.

        Fast path: a step inside the block the latest growth backed (most decode steps) allocates
        nothing and runs no room check."""
        h, start = self.holdings[seq.seq_id], seq.num_computed_tokens
        end = start + num_new
        if h.backed_from <= start and end <= h.backed_to:
            return
        comp_new = self.comp.pages_needed(h, end) if self.has_compressed else 0
        swa_new = self.swa.pages_needed(h, start, num_new)
        state_new = self.slots.pages_needed(h)
        if spare_only and not self.arena.can_alloc(swa_new, comp_new, state_new):
            raise ArenaEmpty(f"no spare room for {swa_new} SWA + {comp_new} compressed + {state_new} state pages")
        self._make_room(swa_new, comp_new, state_new, within_pins)
        self._back(h, start, num_new, swa_new, comp_new, state_new)

    def _back(self, h: KvHoldings, start: int, num_new: int, swa_new: int, comp_new: int, state_new: int) -> None:
        """Give positions ``start .. start+num_new-1`` their new pages (``swa_new`` SWA, ``comp_new``
        compressed and ``state_new`` state pages, counted by the caller, who made room for them).
        :meth:`_admit` calls it directly when the arena had room before the hit was claimed (a claim
        takes no page), skipping :meth:`grow`'s recount and room check."""
        if comp_new:
            self.comp.append(h, comp_new)
        if swa_new:
            self.swa.ensure(h, start, num_new)
        if state_new:
            self.slots.take(h)
        b = self.block_size
        h.backed_from = (start + num_new - 1) // b * b
        h.backed_to = h.backed_from + b

    def _make_room(self, swa: int, comp: int, state: int = 0, within_pins: bool = False,
                   protect: dict[str, list[int]] | None = None) -> None:
        """Evict until the new pages fit; :class:`ArenaEmpty` (evicting nothing) when even evicting
        every cached block and releasing every pin would not be enough. ``within_pins``: when the room
        can be made without touching a pin, the compressed blocks the pins need are skipped and no
        pin is released. ``protect`` (owner -> cached block ids): blocks never evicted (a hit about
        to be claimed)."""
        if self.arena.can_alloc(swa, comp, state):
            return
        keep: set[int] | None = None  # compressed blocks not to evict; None: pins may go as usual
        if within_pins and self.swa.num_pins:
            protected = pinned_prefix_blocks(self.swa, self.comp.pool)
            if self._room_possible(swa, comp, state, {COMPRESS: protected}, keep_pins=True):
                keep = protected
        if keep is None and not self._room_possible(swa, comp, state, protect):
            raise ArenaEmpty(f"no room for {swa} SWA + {comp} compressed + {state} state pages even after "
                             "evicting the whole cache")
        pools = {SWA: self.swa.pool, COMPRESS: self.comp.pool}  # the state owner caches nothing
        protect = protect or {}
        skip = {SWA: frozenset(protect.get(SWA, ())), COMPRESS: (keep or frozenset()).union(protect.get(COMPRESS, ()))}
        while not self.arena.can_alloc(swa, comp, state):
            short = [o for o, n in ((SWA, swa), (COMPRESS, comp)) if self.arena.chunks_needed(**{o: n}) > 0]
            if any(pools[o].evict_lru(skip[o]) for o in short):
                continue
            lenders = pools if self.arena.lends_between_owners else ()
            if any(pools[o].reclaim_chunk(skip[o]) for o in lenders):
                continue
            assert keep is None, f"room for {swa} SWA + {comp} compressed + {state} pages within the pins not reached"
            released = self.swa.release_oldest_pin()
            assert released, f"room for {swa} SWA + {comp} compressed + {state} state pages was feasible but not reached"

    def _room_possible(self, swa: int, comp: int, state: int, claimed: dict[str, Iterable[int]] | None = None,
                       keep_pins: bool = False) -> bool:
        """Whether evicting cached blocks (and releasing pins, unless ``keep_pins``) can make the
        room: first the cheap sufficient test (each owner's own cache), then the exact one (what would
        stay in use). ``claimed`` (owner -> block ids): blocks an admission would claim first (they
        could then be neither evicted nor released from a pin)."""
        claimed = claimed or {}
        swa_pool, comp_pool = self.swa.pool, self.comp.pool
        swa_held = [bid for bid in claimed.get(SWA, ()) if swa_pool.is_cached(bid)]
        comp_held = [bid for bid in claimed.get(COMPRESS, ()) if comp_pool.is_cached(bid)]
        if self.arena.can_alloc(max(0, swa - swa_pool.num_cached() + len(swa_held)),
                                max(0, comp - comp_pool.num_cached() + len(comp_held)), state):
            return True
        pins = [] if keep_pins else self.swa.pin_only_ids()
        if pins and claimed.get(SWA):
            taken = set(claimed[SWA])
            pins = [bid for bid in pins if bid not in taken]
        kept = {SWA: swa_pool.kept_after_eviction(pins, swa_held),
                COMPRESS: comp_pool.kept_after_eviction([], comp_held),
                STATE: (self.arena.num_used(STATE), self.arena.owned_chunks(STATE))}
        return self.arena.fits_after_eviction(swa, comp, state, kept)

    # ---- after a step -------------------------------------------------------------------------
    def after_step(self, seq: KvRequest) -> None:
        """``seq.num_computed_tokens`` has advanced: publish full blocks, release the old window."""
        h, computed = self.holdings[seq.seq_id], seq.num_computed_tokens
        if computed < h.quiet_until:  # (most decode steps: no block filled, none left the window)
            return
        b = self.block_size
        full = computed // b
        if full > h.published_upto:
            if self.prefix_caching:
                self._publish(seq, h, full)
                self._set_frontier(seq, h.published_upto, full)
            h.published_upto = full
        release_at = (h.swa_released_upto + 1) * b + self.swa.window - 1
        if release_at <= computed:
            self.swa.release_out_of_window(h, computed)
            release_at = (h.swa_released_upto + 1) * b + self.swa.window - 1
        # the next call with work: a block filled past the published ones, or one more leaving the
        # window (both fields change only here, and at admission, which makes fresh holdings)
        publish_at = (h.published_upto + 1) * b
        h.quiet_until = publish_at if publish_at < release_at else release_at
        h.state_fresh = False
        h.restore_page = -1

    def _publish(self, seq: KvRequest, h: KvHoldings, full: int) -> None:
        """Publish blocks ``h.published_upto .. full-1`` at their prefix nodes. The request's chain
        grows from its tip; where a block's hash is another prefix's (:meth:`PrefixIndex.extend`) the
        chain breaks and the rest of the request stays private."""
        first, tip = h.published_upto, h.tip
        if first > 0 and tip < 0:
            return  # the chain broke earlier
        nodes = self.index.extend(tip, first, seq.hashes_upto(full), seq.block_keys, full)
        if nodes:
            if self.has_compressed:
                self.comp.publish(h, first, nodes)
            self.swa.publish_full(h, nodes, first, seq.num_computed_tokens, seq.num_prompt_tokens, seq.token_ids)
            self.index.refs[nodes[-1]] += 1  # (PrefixIndex.ref, inlined)
            self.index.unref(tip)
            h.tip = tip = nodes[-1]
        if len(nodes) < full - first:
            self.index.unref(tip)
            h.tip = NO_NODE

    # ---- the end ------------------------------------------------------------------------------
    def free(self, seq: KvRequest) -> None:
        """Release everything ``seq`` holds (finished, aborted or preempted)."""
        h = self.holdings.pop(seq.seq_id)
        if self._frontier and h.published_upto < seq.num_prompt_tokens // self.block_size:
            self._set_frontier(seq, h.published_upto, -1)  # (a request past its prompt has no entry)
        self.comp.release_all(h)
        self.swa.release_all(h)
        if h.tip >= 0:
            self.index.unref(h.tip)
        self.slots.give_back(h)
        # the holdings object is dropped with its tables: nothing reads it again

    def reset_prefix_cache(self) -> int:
        """Evict every cached block of both pools, and drop every host copy; returns the device blocks
        evicted."""
        n = self._evict_all_cached()
        if self.host is not None:
            self.host.clear()
        return n

    def drop_cache(self) -> int:
        """Release every retention pin, then evict every cached block (the last resort that lets a
        lone request start again on an arena holding nothing else; the host tier keeps copies of them);
        returns blocks evicted."""
        self.swa.release_all_pins()
        return self._evict_all_cached()

    def _evict_all_cached(self) -> int:
        return self.comp.pool.unpublish_all_cached() + self.swa.pool.unpublish_all_cached()

    def take_host_copies(self) -> tuple[tuple[HostCopy, ...], tuple[HostCopy, ...]]:
        """(stores, loads) the host tier ordered since the last call (the step being built); empty
        without a host tier."""
        return ((), ()) if self.host is None else self.host.take_orders()

    # ---- the runner's view ----------------------------------------------------------------------
    def ship_tables(self, seq_id: int) -> NewTables:
        """The full tables of a newly admitted request; later changes reach the runner as deltas."""
        h = self.holdings[seq_id]
        h.shipped = True
        return _new_tuple(NewTables, (seq_id, tuple(h.comp.pages), tuple(h.swa.pages)))  # (NewTables(...), one frame less)

    def take_updates(self) -> list[TableUpdate]:
        out = self.updates[:]
        self.updates.clear()  # the list object is every holdings' sink: empty it in place
        return out

    # ---- integrity ----------------------------------------------------------------------------
    def check_integrity(self, seqs: list[KvRequest]) -> None:
        """Conservation of ids, chunks and state pages; ref counts equal holders; tables match the
        arena; holdings exist for exactly the given (running) requests; prefix nodes referenced right."""
        assert sorted(self.holdings) == sorted(s.seq_id for s in seqs), "holdings differ from the running requests"
        comp_holders: dict[int, int] = {}
        swa_holders: dict[int, int] = {bid: 1 for bid in self.swa.pinned_ids()}
        scratch: list[int] = []  # pages of SWA entries backed for their step only
        for h in self.holdings.values():
            for pool, table, holders in ((self.comp.pool, h.comp, comp_holders), (self.swa.pool, h.swa, swa_holders)):
                assert len(table.blocks) == len(table.pages)
                for bid, page in zip(table.blocks, table.pages):
                    if bid == SCRATCH and table is h.swa:
                        assert page >= 0, f"seq {h.seq_id}: a scratch SWA entry without a page"
                        scratch.append(page)
                        continue
                    if bid < 0:
                        assert page == -1
                        continue
                    holders[bid] = holders.get(bid, 0) + 1
                    assert pool.page(bid) == page, f"seq {h.seq_id}: stale {pool.owner} page"
        assert len(scratch) == self.arena.num_unmapped(SWA), \
            f"{len(scratch)} scratch SWA entries, {self.arena.num_unmapped(SWA)} unmapped SWA pages"
        assert len(set(scratch)) == len(scratch), "a scratch SWA page in two entries"
        mapped = set(self.swa.pool.pages) - {-1}
        assert mapped.isdisjoint(scratch), "a scratch SWA page is also a logical block's page"
        assert set(self.arena.spare_pages(SWA)).isdisjoint(scratch), "a scratch SWA page is also spare"
        self.comp.pool.check_integrity(comp_holders)
        self.swa.pool.check_integrity(swa_holders)
        self.arena.check_integrity()
        self.slots.check_integrity(list(self.holdings.values()))
        self.index.check_integrity([h.tip for h in self.holdings.values() if h.tip >= 0])
        if self.host is not None:
            self.host.check_integrity()
        assert self.swa.num_pins <= max(self.swa.max_pins, 0)
        assert all(sid in self.holdings for sid, _ in self._frontier.values()), "frontier of a gone request"
