"""Long chunks respect retention pins: what a pinned checkpoint needs, and the longest chunk that
fits without it.

A retention pin keeps an SWA window (a checkpoint) cached; the checkpoint is reachable only while the
compressed blocks of its prefix node and of every node before it stay cached (evicting the one at
its node even releases the pin). A prefill chunk sized to the token budget alone can need more room
than the arena has free and cached outside those blocks: the room would then be made by releasing
pins and evicting the prefixes they keep, which a smaller budget, running the same prompt in shorter
chunks, keeps. So the block manager sizes a long chunk to what fits *within the pins*: neither
releasing a pin nor evicting a compressed block in :func:`pinned_prefix_blocks`.

Pure Python: part of the control plane.
"""

from __future__ import annotations

from typing import Callable

from atom.kv.block_pool import BlockPool
from atom.kv.swa_pool import SlidingWindowPool

__all__ = ["pinned_prefix_blocks", "longest_fitting_chunk"]


def pinned_prefix_blocks(swa: SlidingWindowPool, comp: BlockPool) -> set[int]:
    """The cached compressed blocks the pinned SWA windows need: those at each pinned block's prefix
    node and at every node before it. One walk up each chain, each node visited once."""
    out: set[int] = set()
    seen: set[int] = set()
    node_of, comp_at, parent_of = swa.pool.node, comp.index.comp, comp.index.parent
    for bid in swa.pinned_ids():
        node = node_of[bid]
        while node >= 0 and node not in seen:
            seen.add(node)
            cid = comp_at[node]
            if cid >= 0 and comp.is_cached(cid):
                out.add(cid)
            node = parent_of[node]
    return out


def longest_fitting_chunk(start: int, num_new: int, block_size: int, fits: Callable[[int], bool]) -> int:
    """The longest of ``num_new`` tokens from position ``start`` and the chunks from ``start`` to a
    block end below it for which ``fits`` holds, else 0. ``fits`` must be monotone (a longer chunk
    needs no fewer pages), so the block ends are bisected: O(log(num_new / block_size)) calls."""
    if fits(num_new):
        return num_new
    first = min(num_new, block_size - start % block_size)
    if first == num_new or not fits(first):
        return 0
    lo, hi = 0, (num_new - first - 1) // block_size  # candidate k: first + k * block_size tokens, below num_new
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(first + mid * block_size):
            lo = mid
        else:
            hi = mid - 1
    return first + lo * block_size
