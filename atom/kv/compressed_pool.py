"""CompressedPool: the compressed blocks of every request, the policy twin of SlidingWindowPool.

A compressed block holds the compressed rows (and indexer keys) of ``block_size`` positions for
every compressed layer. Unlike SWA blocks, a request holds every compressed block it has until it
ends: attention reads the whole compressed history. Rules:

- a prefix hit claims the published blocks of the verified chain (``claim_hit``);
- every block a step reaches gets a page before the step (``pages_needed`` / ``append``);
- a block is published once its last position ran (``publish``), at its prefix node;
- at the end every block is released, the last first (so LRU evicts a prefix's tail before its
  head); published ones stay cached for later hits when prefix caching is on.
"""

from __future__ import annotations

from typing import Sequence

from atom.kv.block_pool import BlockPool
from atom.kv.kv_holdings import KvHoldings
from atom.kv.page_map import COMPRESS, LogicalPageMap
from atom.kv.prefix_index import PrefixIndex

__all__ = ["CompressedPool"]


class CompressedPool:
    """Compressed block bookkeeping for all requests. Pure policy over a :class:`BlockPool`."""

    def __init__(self, arena: LogicalPageMap, index: PrefixIndex, num_ids: int, block_size: int,
                 keep_cached: bool) -> None:
        self.pool = BlockPool(COMPRESS, arena, index, num_ids)
        self.block_size = block_size
        self.keep_cached = keep_cached  # prefix caching on: released published blocks stay cached

    def hit_blocks(self, chain: Sequence[int]) -> int:
        """Leading blocks of the verified chain (node ids) whose compressed block is published."""
        return self.published(chain)[0]

    def published(self, chain: Sequence[int]) -> tuple[int, list[int]]:
        """(:meth:`hit_blocks`, the block published at each node of ``chain``, -1 where none): one
        pass that also lists what an admission claims (``ids[:hit]``)."""
        comp = self.pool.index.comp
        ids = [comp[node] for node in chain]
        return (ids.index(-1) if -1 in ids else len(ids)), ids

    def claim_hit(self, h: KvHoldings, chain: Sequence[int], blocks: int, ids: list[int] | None = None) -> None:
        """Claim the published blocks at ``chain[:blocks]``; ``ids``: those blocks, when the caller
        has read them from the index already (not read again)."""
        if ids is None:
            comp = self.pool.index.comp
            ids = [comp[node] for node in chain[:blocks]]
        self.pool.claim_many(ids)
        pages = self.pool.pages  # (read once, not per block)
        h.write(COMPRESS, 0, ids, [pages[bid] for bid in ids])

    def pages_needed(self, h: KvHoldings, end_pos: int) -> int:
        """New blocks positions up to ``end_pos`` (exclusive) need."""
        n = -(-end_pos // self.block_size) - len(h.comp.blocks)
        return n if n > 0 else 0

    def append(self, h: KvHoldings, n: int) -> None:
        """Back ``n`` new blocks after the request's last (``n`` = :meth:`pages_needed`, counted by
        the caller, who made room for them)."""
        if n:
            ids, pages = self.pool.allocate(n)
            h.write(COMPRESS, len(h.comp.blocks), ids, pages)

    def publish(self, h: KvHoldings, first: int, nodes: Sequence[int]) -> None:
        """Publish blocks ``first ..`` at ``nodes`` (block ``first + i`` at ``nodes[i]``)."""
        self.pool.publish_run(h.comp.blocks[first:first + len(nodes)], nodes)

    def release_all(self, h: KvHoldings) -> None:
        """Release every block, the last first."""
        self.pool.release_many(reversed(h.comp.blocks), keep=self.keep_cached)
