"""SlidingWindowPool: paged, content-addressed SWA blocks with window freeing and retention pins.

An SWA block holds the raw KV rows of ``block_size`` positions for every layer, plus the fused CSA
boundary state of that block (captured from the compressor while its last 4 positions ran). It is
published at the same prefix node as the compressed block at the same index.

Rules (the full statement, with examples, is ``docs/prefix_cache.md``):

- Every block a step touches gets a page before the step; all its rows are written by the step.
  A block is published only once **all** ``block_size`` rows are written (``publish_full``), and
  only if it outlives the step (a block that leaves the window in the same step and is not kept
  would be evicted at once).
- A block that a step writes and that leaves the window at the end of that step, and is not kept (see
  below), gets a page for the step but no logical id (``SCRATCH`` in the table): most blocks of a long
  prefill chunk. A waiting request that makes such a window kept gives it ids (``promote``).
- After a step, blocks that no query will read again (``(j+1)*B <= computed - W + 1``) are released.
  Default mode keeps cached only the blocks the request got from the cache and the windows before its
  prompt's last block boundary (where a repeat of the prompt resumes) and before a shared-prefix
  junction (a boundary up to which an earlier request's compressed blocks matched but whose window
  was gone: the next request with that prefix resumes there), and evicts the rest at once unless
  another sequence holds them; ``full_retain`` keeps every published block cached (LRU), so
  later requests can hit mid-sequence. Blocks still held when a sequence ends are kept cached in both
  modes (the tail that a follow-up turn resumes from).
- ``retention_interval`` (needs full retain): the tail blocks before every multiple of the interval
  and before the prompt boundary are *pinned* (an extra reference) when published. Pins are capped
  at ``max_pins`` pages; past it the least recently used pin is released. A pin is also released when
  the compressed block with the same hash is evicted (the checkpoint can no longer be reached).
- ``bounded_hit`` limits a prefix hit to the largest boundary whose trailing window is cached and, on
  models with CSA layers, whose boundary state was captured.
- With an MTP layer (``mtp_rows``), the MTP row at a block's last position was computed from the token
  that followed the block in the sequence that published it, which the block's key does not cover. The
  pool records that token per published block (``next_token``), and ``bounded_hit`` accepts a
  boundary only where it equals the querying request's token there, so that row is never served to a
  request whose next token differs (it recomputes from an earlier boundary instead).
"""

from __future__ import annotations

from collections import OrderedDict
from itertools import chain
from typing import Iterable, Sequence

from atom.config import CacheConfig
from atom.kv.block_pool import BlockPool
from atom.kv.kv_holdings import SCRATCH, KvHoldings
from atom.kv.page_map import SWA, LogicalPageMap
from atom.kv.prefix_index import PrefixIndex

__all__ = ["SlidingWindowPool"]


class SlidingWindowPool:
    """SWA block bookkeeping for all requests. Pure policy over a :class:`BlockPool`."""

    def __init__(self, arena: LogicalPageMap, index: PrefixIndex, num_ids: int, block_size: int, window: int,
                 tail_blocks: int, cache: CacheConfig, max_pins: int, needs_state: bool, has_compressed: bool,
                 mtp_rows: bool = False) -> None:
        self.pool = BlockPool(SWA, arena, index, num_ids)
        self.index = index
        self.mtp_rows = mtp_rows
        self.next_token = [-1] * num_ids  # MTP: the token after each published block in its publisher
        self.block_size = block_size
        self.window = window
        self.tail_blocks = tail_blocks
        self.full_retain = cache.swa_full_retain
        self.retention_interval = cache.swa_retention_interval
        self.max_pins = max_pins
        self.needs_state = needs_state
        self.has_compressed = has_compressed
        self._pins: OrderedDict[int, None] = OrderedDict()
        self.pool.unlock_tokens = self.unlock_tokens

    def unlock_tokens(self, bid: int) -> int:
        """Recompute tokens cached block ``bid`` saves: as the last window block before boundary
        ``j+1`` it makes the cached compressed prefix ``0..j`` reusable, ``(j+1)*B`` tokens (0 when
        that compressed block is gone, or, with CSA layers, its boundary state was never captured).
        Eviction weighs it against age, so a window that unlocks a long cached document outlives
        windows that unlock nothing."""
        node, index = self.pool.node[bid], self.index
        if node < 0 or not self.has_compressed or (index.comp[node] < 0 and index.host_comp[node] < 0):
            return 0
        if self.needs_state and not self.pool.captured[bid]:
            return 0
        return (index.depth[node] + 1) * self.block_size

    # ---- prefix hits --------------------------------------------------------------------------
    def bounded_hit(self, chain: Sequence[int], limit: int, tokens: Sequence[int] = (),
                    host_next: dict[int, int] | None = None) -> tuple[int, int]:
        """(largest boundary <= ``limit`` whose trailing window blocks are all cached, the same also
        requiring the captured CSA state in the block before it). Both 0 when nothing qualifies
        (recompute from the start). With MTP rows, a boundary ``b`` also needs ``tokens[b * block_size]``
        (the querying request's token after it) to be the token its last window block's MTP row was
        computed with. Boundaries are tried from ``limit`` down, so a hit near the end of the chain
        costs a few window checks, not a pass over the chain.

        ``host_next`` (the host tier's SWA next tokens, when it is on): a window block with no device
        block but a host copy counts as cached (a copy was published, so its state was captured)."""
        tail, captured, b_size = self.tail_blocks, self.pool.captured, self.block_size
        follows = self.next_token if self.mtp_rows else None
        index = self.index
        swa_at = index.swa
        if limit and host_next is None and follows is None:  # first the boundary at ``limit`` alone
            window = [swa_at[n] for n in chain[limit - tail if limit > tail else 0:limit]]
            if -1 not in window and (not self.needs_state or captured[window[-1]]):
                return limit, limit  # (the usual hit: a prefix cached to its end; no pass over the chain)
        nodes = chain[:limit]
        swa = [swa_at[n] for n in nodes]
        if host_next is not None:  # a host-only copy as -2 - its host page
            host = index.host_swa
            swa = [bid if bid >= 0 else (-2 - host[n] if host[n] >= 0 else -1) for bid, n in zip(swa, nodes)]
        window_only = with_state = 0
        for b in range(limit, 0, -1):
            bid = swa[b - 1]
            if bid == -1 or -1 in swa[max(0, b - tail):b]:
                continue
            if follows is not None:
                after = follows[bid] if bid >= 0 else host_next.get(-2 - bid, -1)
                if after != tokens[b * b_size]:
                    continue
            window_only = window_only or b
            if not self.needs_state or bid < 0 or captured[bid]:
                with_state = b
                break
        return window_only, (with_state if self.needs_state else window_only)

    def claim_hit(self, h: KvHoldings, chain: Sequence[int], boundary: int, ids: list[int] | None = None) -> None:
        """Give the request the trailing window blocks of a hit at ``boundary`` (earlier: -1).
        ``ids``: those blocks (``chain[boundary - tail_blocks:boundary]``'s), when the caller has
        read them from the index already (not read again)."""
        first = boundary - self.tail_blocks if boundary > self.tail_blocks else 0
        if ids is None:
            swa_at = self.index.swa
            ids = [swa_at[n] for n in chain[first:boundary]]
        assert -1 not in ids, "claim_hit on a boundary that bounded_hit did not allow"
        self.pool.claim_many(ids)
        pins = self._pins
        if pins:
            for bid in ids:
                if bid in pins:
                    pins.move_to_end(bid)
        h.write(SWA, first, ids, [self.pool.pages[bid] for bid in ids])
        h.swa_released_upto = first
        h.restore_page = h.swa.pages[boundary - 1] if (self.needs_state and boundary) else -1

    # ---- per step -----------------------------------------------------------------------------
    def pages_needed(self, h: KvHoldings, start: int, num_new: int) -> int:
        """New SWA pages positions ``start .. start+num_new-1`` need."""
        first, last = start // self.block_size, (start + num_new - 1) // self.block_size
        blocks, held = h.swa.blocks, len(h.swa.blocks)
        if first >= held:
            return last - first + 1
        return blocks[first:last + 1].count(-1) + (last + 1 - held if last + 1 > held else 0)

    def ensure(self, h: KvHoldings, start: int, num_new: int) -> None:
        """Back every block positions ``start ..`` touch (room was made by the caller). New blocks
        that leave the window at the end of this step and are not kept (:meth:`_kept_indices`) get a
        page but no logical id (``SCRATCH`` in the table, :meth:`_back_with_scratch`)."""
        first, last = start // self.block_size, (start + num_new - 1) // self.block_size
        blocks = h.swa.blocks
        if first >= len(blocks):  # the usual case: every block is new, one run
            leaving = self._window_start(start + num_new)
            leaving = leaving if leaving <= last else last + 1
            if leaving > first and not self.full_retain:
                self._back_with_scratch(h, first, last, leaving)
                return
            ids, pages = self.pool.allocate(last - first + 1)
            h.write(SWA, first, ids, pages)
            return
        missing = [j for j in range(first, last + 1) if j >= len(blocks) or blocks[j] == -1]
        ids, pages = self.pool.allocate(len(missing))
        for j, bid, page in zip(missing, ids, pages):
            h.write(SWA, j, [bid], [page])

    def _back_with_scratch(self, h: KvHoldings, first: int, last: int, leaving: int) -> None:
        """Back new blocks ``first .. last`` of which ``first .. leaving-1`` leave the window after
        this step: those not kept get a page only (a prefill chunk's window-long tail is all a later
        query reads; the runner still writes every row of the chunk into its pages), the rest get
        logical ids too. The pages are taken in one run (the arena lends the spare pages of the
        previous such step first); so a block that leaves costs no id, no reference and no
        publication, and :meth:`release_out_of_window` hands its page back without an id to drop."""
        arena, n = self.pool.arena, last - first + 1
        pages = arena.take_unmapped(SWA, n)
        table = [SCRATCH] * (leaving - first)
        keep = sorted(self._kept_indices(h, first, leaving))
        ids = self.pool.bind([pages[j - first] for j in keep] + pages[leaving - first:])
        for j, bid in zip(keep, ids):
            table[j - first] = bid
        h.write(SWA, first, table + ids[len(keep):], pages)

    def promote(self, h: KvHoldings, boundary: int) -> None:
        """The window before ``boundary`` is now kept (a retention boundary added after the step was
        backed): its ``SCRATCH`` blocks get logical ids for the pages they have (no table change)."""
        blocks = h.swa.blocks
        idx = [j for j in range(max(0, boundary - self.tail_blocks), min(boundary, len(blocks)))
               if blocks[j] == SCRATCH]
        if idx:
            ids = self.pool.bind([h.swa.pages[j] for j in idx])
            for j, bid in zip(idx, ids):
                blocks[j] = bid

    def publish_full(self, h: KvHoldings, nodes: Sequence[int], first_block: int, computed: int,
                     num_prompt_tokens: int, tokens: Sequence[int] = ()) -> None:
        """Publish blocks ``first_block ..`` at ``nodes`` (all rows written, state captured), except
        those that leave the window now and would not be kept (they are freed at once). ``tokens``:
        the publishing request's tokens (with MTP rows, the token after each block is recorded)."""
        blocks, pool = h.swa.blocks, self.pool
        end = first_block + len(nodes)
        gone = self._window_start(computed)
        gone = first_block if gone < first_block else (end if gone > end else gone)
        keep = self._kept_indices(h, first_block, gone)  # (all before ``gone``)
        held = len(blocks)
        checkpoints = self.full_retain and self.retention_interval  # (else no block is one: no call per block)
        for j in chain(sorted(keep), range(gone, end)):  # ascending: the blocks not freed at once
            bid = blocks[j] if j < held else -1
            if bid < 0:
                continue
            node = nodes[j - first_block]
            pool.captured[bid] = True
            if not pool.publish(bid, node):
                continue
            if self.mtp_rows:
                self.next_token[bid] = tokens[(j + 1) * self.block_size]
            if checkpoints and self._is_checkpoint(j, num_prompt_tokens):
                self._pin(bid)

    def release_out_of_window(self, h: KvHoldings, computed: int) -> None:
        """Release blocks no future query reads (they left the window): the kept ones to the cache,
        the rest freed; one table delta for the run."""
        lo, hi, held = h.swa_released_upto, self._window_start(computed), len(h.swa.blocks)
        hi = hi if hi < held else held
        if hi <= lo:
            return
        keep, run = self._kept_indices(h, lo, hi), h.swa.blocks[lo:hi]
        held: Iterable[tuple[int, int]] = enumerate(run, lo)  # (index, block) of the entries to release
        if SCRATCH in run:  # pages lent for the step without ids (_back_with_scratch): only the pages go back
            pages, held = _scratch_pages(run, h.swa.pages, lo)
            self.pool.arena.give_back_unmapped(SWA, pages)
        kept, dropped = [], []
        for j, bid in held:  # ascending: what is kept, what is freed
            if bid >= 0:
                if j in keep:
                    kept.append(bid)
                else:
                    dropped.append(bid)
        if kept:
            self.pool.release_many(kept, keep=True)
        if dropped:
            self.pool.release_many(dropped, keep=False)
        none = [-1] * (hi - lo)
        h.write(SWA, lo, none, none)
        h.swa_released_upto = hi

    def _window_start(self, computed: int) -> int:
        """Blocks before this one are out of every future query's window."""
        start = (computed - self.window + 1) // self.block_size
        return start if start > 0 else 0

    def _kept_indices(self, h: KvHoldings, lo: int, hi: int) -> range | set[int]:
        """Blocks in ``lo .. hi-1`` that stay cached when they leave the window: all with full
        retain; by default only blocks that came from the cache (a hit) and the windows before the
        boundaries in ``h.retain_boundaries`` (the prompt's last block boundary, where a repeat of
        the prompt resumes, and a shared-prefix junction found at admission or by a waiting request)."""
        if self.full_retain:
            return range(lo, hi)
        hit = h.hit_blocks if h.hit_blocks < hi else hi
        kept: range | set[int] = range(lo, hit if hit > lo else lo)
        for b in h.retain_boundaries:  # (a range while one stretch is kept: no set built)
            first = b - self.tail_blocks
            window = range(first if first > lo else lo, b if b < hi else hi)
            if window:
                if kept:
                    kept = set(kept).union(window)
                else:
                    kept = window
        return kept

    def release_all(self, h: KvHoldings) -> None:
        """Release every block held; published ones stay cached (the resumable tail)."""
        held = h.swa.blocks[h.swa_released_upto:]  # entries before it are -1 (released)
        if SCRATCH in held:  # (ended between a step's growth and its end)
            self.pool.arena.give_back_unmapped(SWA, _scratch_pages(held, h.swa.pages, h.swa_released_upto)[0])
        held.reverse()
        if -1 in held or SCRATCH in held:  # (rare: every entry from the released mark on holds a block)
            held = [bid for bid in held if bid >= 0]
        self.pool.release_many(held, keep=True)

    # ---- pins ---------------------------------------------------------------------------------
    def _is_checkpoint(self, j: int, num_prompt_tokens: int) -> bool:
        if not (self.full_retain and self.retention_interval):
            return False
        end = (j + 1) * self.block_size
        to_interval = -end % self.retention_interval
        prompt_boundary = (num_prompt_tokens // self.block_size) * self.block_size
        to_prompt = prompt_boundary - end
        span = (self.tail_blocks - 1) * self.block_size
        return to_interval <= span or 0 <= to_prompt <= span

    def _pin(self, bid: int) -> None:
        if bid in self._pins or self.max_pins == 0:
            return
        self.pool.claim(bid)
        self._pins[bid] = None
        while len(self._pins) > self.max_pins:
            self._unpin(next(iter(self._pins)))

    def _unpin(self, bid: int) -> None:
        del self._pins[bid]
        self.pool.release(bid, keep=True)

    def release_oldest_pin(self) -> bool:
        """Release the least recently used pin (its block becomes ordinary cache). False if none."""
        if not self._pins:
            return False
        self._unpin(next(iter(self._pins)))
        return True

    def unpin_node(self, node: int) -> None:
        """The compressed block at ``node`` was evicted: the SWA checkpoint there is unreachable."""
        bid = self.index.swa[node]
        if bid >= 0 and bid in self._pins:
            self._unpin(bid)

    @property
    def num_pins(self) -> int:
        return len(self._pins)

    def pinned_ids(self) -> list[int]:
        return list(self._pins)

    def pin_only_ids(self) -> list[int]:
        """Pinned blocks no sequence holds (releasing the pin would make them cached)."""
        return [bid for bid in self._pins if self.pool.ref[bid] == 1]

    def release_all_pins(self) -> int:
        n = len(self._pins)
        while self._pins:
            self._unpin(next(iter(self._pins)))
        return n


def _scratch_pages(run: list[int], pages: list[int], lo: int) -> tuple[list[int], Iterable[tuple[int, int]]]:
    """(the pages of the ``SCRATCH`` entries of ``run``, (index, entry) of its other entries) for table
    entries ``lo ..`` (``pages`` is the whole page table). Usually the scratch entries are one stretch
    (a chunk's blocks that left the window, after the previous window's blocks and before the kept
    ones): then one slice of pages and the few other entries, else one pass over the run."""
    k = run.count(SCRATCH)
    f = run.index(SCRATCH) if k else 0
    if run[f:f + k] == [SCRATCH] * k:
        return pages[lo + f:lo + f + k], chain(enumerate(run[:f], lo), enumerate(run[f + k:], lo + f + k))
    return [page for bid, page in zip(run, pages[lo:lo + len(run)]) if bid == SCRATCH], \
        [(j, bid) for j, bid in enumerate(run, lo) if bid != SCRATCH]
