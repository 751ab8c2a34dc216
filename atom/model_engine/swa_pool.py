"""SlidingWindowPool: paged, content-addressed SWA blocks with window freeing and retention pins.

An SWA block holds the raw KV rows of ``block_size`` positions for every layer, plus the fused CSA
boundary state of that block (captured from the compressor while its last 4 positions ran). Its
hash is the same chained hash as the compressed block at the same index.

Rules (the full statement, with examples, is ``docs/prefix_cache.md``):

- Every block a step touches gets a page before the step; all its rows are written by the step.
  A block is published only once **all** ``block_size`` rows are written (``publish_full``).
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
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Callable, Sequence

from atom.model_engine.block_pool import BlockPool
from atom.model_engine.unified_kv_arena import SWA, UnifiedKvArena

if TYPE_CHECKING:
    from atom.model_engine.sequence import Sequence as Seq

__all__ = ["SlidingWindowPool"]


class SlidingWindowPool:
    """SWA block bookkeeping for all sequences. Pure policy over a :class:`BlockPool`."""

    def __init__(self, arena: UnifiedKvArena, window: int, full_retain: bool, retention_interval: int,
                 max_pins: int, needs_state: bool) -> None:
        lay = arena.layout
        self.pool = BlockPool(SWA, arena, lay.max_swa_pages)
        self.block_size = lay.spec.block_size
        self.window = window
        self.tail_blocks = lay.spec.tail_blocks
        self.full_retain = full_retain
        self.retention_interval = retention_interval
        self.max_pins = max_pins
        self.needs_state = needs_state
        self._pins: OrderedDict[int, None] = OrderedDict()
        self.compressed_published: Callable[[int], bool] = lambda block_hash: False
        self.pool.unlock_tokens = self.unlock_tokens

    def unlock_tokens(self, bid: int) -> int:
        """Recompute tokens cached block ``bid`` saves: as the last window block before boundary
        ``j+1`` it makes the cached compressed prefix ``0..j`` reusable, ``(j+1)*B`` tokens (0 when
        that compressed block is gone, or, with CSA layers, its boundary state was never captured).
        Eviction weighs it against age, so a window that unlocks a long cached document outlives
        windows that unlock nothing."""
        block = self.pool.blocks[bid]
        if block.block_hash is None or block.index < 0 or not self.compressed_published(block.block_hash):
            return 0
        if self.needs_state and not block.state_captured:
            return 0
        return (block.index + 1) * self.block_size
        self.on_table_change: Callable[[Seq, int, int], None] = lambda seq, idx, page: None

    # ---- prefix hits --------------------------------------------------------------------------
    def window_cached(self, hashes: Sequence[int], tokens: Callable[[int], tuple[int, ...]], boundary: int,
                      need_state: bool) -> bool:
        """Whether the SWA blocks before block ``boundary`` that its window needs are all cached
        (and, with ``need_state``, carry a captured CSA boundary state in the last one)."""
        for j in range(max(0, boundary - self.tail_blocks), boundary):
            bid = self.pool.lookup(hashes[j], tokens(j))
            if bid is None:
                return False
            if need_state and j == boundary - 1 and not self.pool.blocks[bid].state_captured:
                return False
        return True

    def bounded_hit(self, hashes: Sequence[int], tokens: Callable[[int], tuple[int, ...]],
                    limit: int) -> tuple[int, int]:
        """(largest boundary <= ``limit`` whose window is cached, the same also requiring the CSA
        state). Both are 0 when nothing qualifies (recompute from the start)."""
        window_only = next((b for b in range(limit, 0, -1) if self.window_cached(hashes, tokens, b, False)), 0)
        if not self.needs_state:
            return window_only, window_only
        with_state = next((b for b in range(window_only, 0, -1) if self.window_cached(hashes, tokens, b, True)), 0)
        return window_only, with_state

    def claim_hit(self, seq: Seq, boundary: int) -> None:
        """Give ``seq`` the trailing window blocks of a hit at ``boundary`` (earlier blocks: -1)."""
        first = max(0, boundary - self.tail_blocks)
        seq.swa_blocks = [-1] * first
        seq.swa_pages = [-1] * first
        for j in range(first, boundary):
            bid = self.pool.lookup(seq.block_hashes[j], seq.block_tokens(j))
            assert bid is not None, "claim_hit on a boundary that bounded_hit did not allow"
            self.pool.claim(bid)
            if bid in self._pins:
                self._pins.move_to_end(bid)
            seq.swa_blocks.append(bid)
            seq.swa_pages.append(self.pool.page(bid))
        seq.swa_released_upto = first
        seq.restore_page = seq.swa_pages[boundary - 1] if (self.needs_state and boundary) else -1

    # ---- per step -----------------------------------------------------------------------------
    def pages_needed(self, seq: Seq, num_new: int) -> int:
        """New SWA pages the next ``num_new`` positions of ``seq`` need."""
        first, last = self._step_blocks(seq, num_new)
        return sum(1 for j in range(first, last + 1) if j >= len(seq.swa_blocks) or seq.swa_blocks[j] < 0)

    def ensure(self, seq: Seq, num_new: int) -> None:
        """Back every block the next ``num_new`` positions touch (room was made by the caller)."""
        first, last = self._step_blocks(seq, num_new)
        missing = [j for j in range(first, last + 1) if j >= len(seq.swa_blocks) or seq.swa_blocks[j] < 0]
        for j, bid in zip(missing, self.pool.allocate(len(missing))):
            while len(seq.swa_blocks) <= j:
                seq.swa_blocks.append(-1)
                seq.swa_pages.append(-1)
            seq.swa_blocks[j] = bid
            seq.swa_pages[j] = self.pool.page(bid)
            self.on_table_change(seq, j, seq.swa_pages[j])

    def publish_full(self, seq: Seq, first_block: int, end_block: int) -> None:
        """Publish blocks ``first_block .. end_block-1`` of ``seq`` (all rows written, state captured)."""
        for j in range(first_block, end_block):
            bid = seq.swa_blocks[j]
            if bid < 0:
                continue
            self.pool.blocks[bid].state_captured = True
            self.pool.blocks[bid].index = j
            if self.pool.publish(bid, seq.block_hashes[j], seq.block_tokens(j)) and self._is_checkpoint(seq, j):
                self._pin(bid)

    def release_out_of_window(self, seq: Seq) -> None:
        """Release blocks no future query of ``seq`` reads (they left the window)."""
        computed = seq.num_computed_tokens
        limit = max(0, (computed - self.window + 1) // self.block_size)
        for j in range(seq.swa_released_upto, min(limit, len(seq.swa_blocks))):
            bid = seq.swa_blocks[j]
            if bid >= 0:
                self.pool.release(bid, keep=self._keep_after_window(seq, j))
                seq.swa_blocks[j] = -1
                seq.swa_pages[j] = -1
                self.on_table_change(seq, j, -1)
        seq.swa_released_upto = max(seq.swa_released_upto, min(limit, len(seq.swa_blocks)))

    def _keep_after_window(self, seq: Seq, j: int) -> bool:
        """Whether block ``j`` stays cached when it leaves ``seq``'s window: always with full retain;
        by default only a block that came from the cache (a hit) and the windows before the
        boundaries in ``seq.retain_boundaries`` (its prompt's last block boundary, where a repeat of
        the prompt resumes, and a shared-prefix junction found at admission)."""
        if self.full_retain or j < seq.num_cached_tokens // self.block_size:
            return True
        return any(b - self.tail_blocks <= j < b for b in seq.retain_boundaries)

    def release_seq(self, seq: Seq) -> None:
        """Release every block ``seq`` holds; published ones stay cached (the resumable tail)."""
        for j in range(len(seq.swa_blocks) - 1, -1, -1):
            if seq.swa_blocks[j] >= 0:
                self.pool.release(seq.swa_blocks[j], keep=True)
        seq.swa_blocks, seq.swa_pages = [], []
        seq.swa_released_upto = 0

    # ---- pins ---------------------------------------------------------------------------------
    def _is_checkpoint(self, seq: Seq, j: int) -> bool:
        if not (self.full_retain and self.retention_interval):
            return False
        end = (j + 1) * self.block_size
        to_interval = -end % self.retention_interval
        prompt_boundary = (seq.num_prompt_tokens // self.block_size) * self.block_size
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

    def unpin_hash(self, block_hash: int) -> None:
        """The compressed block with this hash was evicted: its SWA checkpoint is unreachable."""
        bid = self.pool._hash_to_id.get(block_hash)
        if bid is not None and bid in self._pins:
            self._unpin(bid)

    @property
    def num_pins(self) -> int:
        return len(self._pins)

    def pinned_ids(self) -> list[int]:
        return list(self._pins)

    def pin_only_ids(self) -> list[int]:
        """Pinned blocks no sequence holds (releasing the pin would make them cached)."""
        return [bid for bid in self._pins if self.pool.blocks[bid].ref_count == 1]

    def release_all_pins(self) -> int:
        n = len(self._pins)
        while self._pins:
            self._unpin(next(iter(self._pins)))
        return n

    def _step_blocks(self, seq: Seq, num_new: int) -> tuple[int, int]:
        start = seq.num_computed_tokens
        return start // self.block_size, (start + num_new - 1) // self.block_size
