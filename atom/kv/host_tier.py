"""How the block manager uses its host pool (:mod:`atom.kv.host_pool`): the write-back hooks on its two
block pools, giving a hit's host-only blocks device pages again, and write-through.

Kept apart from :mod:`atom.kv.block_manager` because these are the only places the host tier touches
the device pools; the block manager calls them at three points (construction, admission, the claim of
a hit) and otherwise knows the tier only through the prefix index's ``host_comp`` / ``host_swa`` columns.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from atom.config import CacheConfig
from atom.kv.host_pool import HostPool
from atom.kv.kv_layout import KvLayout
from atom.kv.page_map import COMPRESS, SWA

if TYPE_CHECKING:
    from atom.kv.block_manager import BlockManager

__all__ = ["attach", "restore", "write_through"]


def attach(bm: BlockManager, layout: KvLayout, cache: CacheConfig) -> HostPool | None:
    """The host tier under ``bm``'s arena (``cache.host_kv_cache_bytes`` > 0 with prefix caching), its
    pools set to write published blocks back to it when they evict them; None when off. An SWA block
    whose compressed block is gone from both tiers is not written back: it unlocks nothing."""
    if not cache.host_kv_cache_bytes or not bm.prefix_caching:
        return None
    host = HostPool(layout, cache.host_kv_cache_bytes, bm.index)
    comp, swa, window = bm.comp.pool, bm.swa.pool, bm.swa
    comp.write_back = lambda bid, node: host.store(COMPRESS, node, comp.pages[bid])
    needs_comp, comp_at, host_comp_at = bm.has_compressed, bm.index.comp, bm.index.host_comp

    def swa_back(bid: int, node: int) -> None:
        if needs_comp and comp_at[node] < 0 and host_comp_at[node] < 0:
            return
        host.store(SWA, node, swa.pages[bid], window.next_token[bid] if window.mtp_rows else -1)
    swa.write_back = swa_back
    return host


def restore(bm: BlockManager, nodes: dict[str, list[int]], claimed: dict[str, list[int]],
            room: tuple[int, int, int]) -> None:
    """Give a hit's host-only blocks (``nodes`` per owner) device pages again: room is made without
    evicting the hit's device blocks (``claimed``) or the copies about to be read; each block is
    published back at its node with a load order for its page and left cached, for the hit's claim.
    ``room``: the (SWA, compressed, state) pages of the restored blocks and the first chunk, made at
    once (room made for the restored pages alone could fragment chunks so that the first chunk no
    longer fits); the caller checked it can be made (admission is all or nothing)."""
    host = bm.host
    for owner, owner_nodes in nodes.items():
        for node in owner_nodes:
            host.protect(owner, node)
    bm._make_room(*room, within_pins=True, protect=claimed)
    for owner, pool in ((COMPRESS, bm.comp.pool), (SWA, bm.swa.pool)):
        owner_nodes = nodes[owner]
        if not owner_nodes:
            continue
        ids, pages = pool.allocate(len(owner_nodes))
        for bid, page, node in zip(ids, pages, owner_nodes):
            if owner == SWA:
                pool.captured[bid] = True  # a published SWA block's boundary state was captured
                if bm.swa.mtp_rows:
                    bm.swa.next_token[bid] = host.next_token.get(bm.index.host_swa[node], -1)
            host.load(owner, node, page)
            published = pool.publish(bid, node)
            assert published, f"{owner}: restored block {bid} could not be published at {bm.index.describe(node)}"
        pool.release_many(ids, keep=True)


def write_through(bm: BlockManager, chain: list[int], blocks: int) -> None:
    """Count a hit of ``blocks`` blocks on its nodes; a node reaching ``bm.write_through_hits`` hits gets
    host copies of its claimed blocks now (store orders; the blocks are fully written and held), so
    evicting them later writes nothing."""
    n, host, tail, index = bm.write_through_hits, bm.host, max(0, blocks - bm.swa.tail_blocks), bm.index
    hits = index.hits
    for j in range(blocks):
        node = chain[j]
        hits[node] += 1
        if hits[node] < n:
            continue
        if bm.has_compressed and index.host_comp[node] < 0:
            host.store(COMPRESS, node, bm.comp.pool.pages[index.comp[node]])
        swa = index.swa[node]
        if j >= tail and index.host_swa[node] < 0:
            host.store(SWA, node, bm.swa.pool.pages[swa], bm.swa.next_token[swa] if bm.swa.mtp_rows else -1)
