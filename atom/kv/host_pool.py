"""The host-memory tier under the device arena: copies of evicted prefix blocks, restored on a hit.

Pure accounting (the runner allocates the bytes, :mod:`atom.model_executor.host_copies`). The host
pool has the arena's geometry: ``num_chunks`` chunks of ``layout.chunk_bytes``, each lent to one owner
and cut into that owner's pages exactly as on the device (``chunk_pages`` SWA pages with their fused
CSA boundary state, or ``compress_pages_per_chunk`` compressed pages with their indexer keys), so host
page ``p`` of an owner sits at the same byte offsets in the host buffer as device page ``p`` in the
arena, and a copy moves a page's bytes between two buffers of one layout.

The pool is *inclusive*: a block restored to the device keeps its host copy, so when the device
evicts it again nothing is written. Each copy hangs on the block's prefix node (the index's
``host_comp[node]`` / ``host_swa[node]``, one reference on the node), so lookups stay the verified chain of
:mod:`atom.kv.prefix_index` (parent + exact key): a host copy is found only under its exact prefix.

Copy orders accumulate here while the scheduler builds a step and leave with the batch
(:meth:`take_orders`): ``store`` (device page -> host page, when the device evicts a published block)
and ``load`` (host page -> device page, a hit). The runner executes every store, then every load,
before the step's forward, so a device page freed by an eviction can take a restored block in the
same step and a block written back can be restored in the same step. A host page with a load pending
is never reused before the orders leave (a store into it would run first and overwrite it).

Host eviction (when a store needs room): the owner's least recently used copies, weighed like the
device's (:meth:`_worth`: an SWA copy is worth the cached prefix tokens it unlocks over its age), then
a whole chunk of the other owner. A store that finds no room is dropped: the block is then simply gone,
as without the tier.
"""

from __future__ import annotations

from dataclasses import dataclass

from atom.kv.chunk_arena import ChunkArena, ChunkBackedFreeList
from atom.kv.kv_layout import KvLayout
from atom.kv.page_map import COMPRESS, SWA, Owner
from atom.kv.prefix_index import PrefixIndex
from atom.kv.tables import HostCopy

__all__ = ["HostPool", "HostTierStats"]

_LRU_WINDOW = 8  # how many of the oldest host copies the valued victim choice looks at


@dataclass(slots=True)
class HostTierStats:
    """Totals of the host tier: prompt tokens served thanks to it, bytes moved each way, and the
    pool's use (whole chunks lent to an owner, in bytes). ``load_wait_seconds`` is filled by the runner
    (the time steps waited for their loads)."""

    host_hit_tokens: int = 0
    host_bytes_in: int = 0  # host -> device (loads)
    host_bytes_out: int = 0  # device -> host (write-back stores)
    host_pages_used: int = 0  # SWA + compressed host pages holding a copy
    host_pool_bytes_used: int = 0
    host_pool_bytes_total: int = 0
    load_wait_seconds: float = 0.0


class HostPool:
    """Host pages per owner, the copies on them, and the copy orders of the step being built."""

    def __init__(self, layout: KvLayout, host_bytes: int, index: PrefixIndex) -> None:
        spec = layout.spec
        self.num_chunks = host_bytes // layout.chunk_bytes
        if self.num_chunks < 1:
            raise ValueError(f"host_kv_cache_bytes={host_bytes} is less than one arena chunk "
                             f"({layout.chunk_bytes} B); give at least that (or 0: no host tier)")
        self.layout = layout
        self.index = index
        self._at = {SWA: index.host_swa, COMPRESS: index.host_comp}  # node -> the host page of its copy
        self.block_size = spec.block_size
        self.chunk_bytes = layout.chunk_bytes
        self.chunks = ChunkArena(self.num_chunks)
        self._lists = {SWA: ChunkBackedFreeList(self.chunks, layout.chunk_pages, "host swa"),
                       COMPRESS: ChunkBackedFreeList(self.chunks, max(1, layout.compress_pages_per_chunk),
                                                     "host compress")}
        self.page_bytes = {SWA: layout.swa_page_bytes, COMPRESS: spec.compressed_block_bytes}  # bytes a copy moves
        # host page -> the node its copy hangs on, least recently used first (dict order)
        self._copies: dict[Owner, dict[int, int]] = {SWA: {}, COMPRESS: {}}
        self._used_at: dict[Owner, dict[int, int]] = {SWA: {}, COMPRESS: {}}
        self.next_token: dict[int, int] = {}  # SWA host page -> token after the block (MTP rows)
        self._loading: set[tuple[Owner, int]] = set()  # host pages read by a pending load order
        self._stores: dict[Owner, dict[int, int]] = {SWA: {}, COMPRESS: {}}  # host page -> device page
        self._loads: dict[Owner, dict[int, int]] = {SWA: {}, COMPRESS: {}}  # device page -> host page
        self.stats = HostTierStats(host_pool_bytes_total=self.num_chunks * self.chunk_bytes)
        self._clock = 0

    # ---- queries ------------------------------------------------------------------------------
    @property
    def num_pages(self) -> dict[Owner, int]:
        """Host pages each owner would have if it held every chunk (the runner's view sizes)."""
        return {owner: self.num_chunks * lst.pages_per_chunk for owner, lst in self._lists.items()}

    def describe(self) -> str:
        """One start-up line: the pool's size and what it can hold."""
        pages = self.num_pages
        return (f"host KV tier: {self.num_chunks} chunks of {self.chunk_bytes} B = "
                f"{self.num_chunks * self.chunk_bytes / 2**30:.3f} GiB ({pages[SWA]:,} SWA pages or "
                f"{pages[COMPRESS] * self.block_size:,} compressed tokens); evicted prefix blocks are kept there")

    def num_copies(self, owner: Owner) -> int:
        return len(self._copies[owner])

    def snapshot(self) -> HostTierStats:
        """The stats with the pool's current use filled in."""
        s = self.stats
        s.host_pages_used = len(self._copies[SWA]) + len(self._copies[COMPRESS])
        s.host_pool_bytes_used = (self.num_chunks - self.chunks.num_free()) * self.chunk_bytes
        return HostTierStats(**{f: getattr(s, f) for f in s.__slots__})

    # ---- write-back ---------------------------------------------------------------------------
    def store(self, owner: Owner, node: int, device_page: int, next_token: int = -1) -> bool:
        """The device evicts the ``owner`` block published at ``node`` from ``device_page``: keep a copy
        (a store order), unless one is kept already. False when no host room could be made."""
        at = self._at[owner]
        have = at[node]
        if have >= 0:
            self._touch(owner, have)
            return True
        page = self._take(owner)
        if page is None:
            return False
        at[node] = page
        self.index.ref(node)
        self._copies[owner][page] = node
        self._used_at[owner][page] = self._tick()
        if owner == SWA and next_token >= 0:
            self.next_token[page] = next_token
        self._stores[owner][page] = device_page
        self.stats.host_bytes_out += self.page_bytes[owner]
        return True

    # ---- restore ------------------------------------------------------------------------------
    def protect(self, owner: Owner, node: int) -> None:
        """The copy at ``node`` is about to be loaded: no store may take its page before the orders leave."""
        page = self._at[owner][node]
        assert page >= 0, f"protect of a node with no host {owner} copy: {self.index.describe(node)}"
        self._loading.add((owner, page))

    def load(self, owner: Owner, node: int, device_page: int) -> None:
        """Restore the copy at ``node`` into ``device_page`` (a load order; the copy stays)."""
        page = self._at[owner][node]
        assert page >= 0, f"load of a node with no host {owner} copy: {self.index.describe(node)}"
        self._loading.add((owner, page))
        self._loads[owner][device_page] = page
        self._touch(owner, page)
        self.stats.host_bytes_in += self.page_bytes[owner]

    def take_orders(self) -> tuple[tuple[HostCopy, ...], tuple[HostCopy, ...]]:
        """(stores, loads) of the step being built, one :class:`HostCopy` per owner and direction;
        the pages they read are free for reuse afterwards."""
        stores = tuple(HostCopy(owner, tuple(m.values()), tuple(m)) for owner, m in self._stores.items() if m)
        loads = tuple(HostCopy(owner, tuple(m.values()), tuple(m)) for owner, m in self._loads.items() if m)
        for m in (*self._stores.values(), *self._loads.values()):
            m.clear()
        self._loading.clear()
        return stores, loads

    # ---- eviction -----------------------------------------------------------------------------
    def _take(self, owner: Owner) -> int | None:
        """A free host page of ``owner``, evicting copies for it; None when nothing can go."""
        lst = self._lists[owner]
        other = COMPRESS if owner == SWA else SWA
        while lst.available() == 0:
            if self._evict_one(owner) or self._evict_chunk(other):
                continue
            return None
        return lst.pop()

    def _evict_one(self, owner: Owner) -> bool:
        """Drop one of the owner's oldest copies: the one worth least (the oldest among equals)."""
        candidates = []
        for page in self._copies[owner]:
            if (owner, page) not in self._loading:
                candidates.append(page)
                if len(candidates) == _LRU_WINDOW:
                    break
        if not candidates:
            return False
        self.drop(owner, min(candidates, key=lambda p: self._worth(owner, p)))
        return True

    def _evict_chunk(self, owner: Owner) -> bool:
        """Drop every copy in the chunk of ``owner``'s least recently used copy whose chunk has no
        pending load, returning that chunk to the pool. False if no chunk qualifies."""
        ppc = self._lists[owner].pages_per_chunk
        busy = {page // ppc for o, page in self._loading if o == owner}
        for page in self._copies[owner]:
            chunk = page // ppc
            if chunk not in busy:
                for victim in [p for p in self._copies[owner] if p // ppc == chunk]:
                    self.drop(owner, victim)
                return True
        return False

    def _worth(self, owner: Owner, page: int) -> float:
        """Recompute tokens the copy saves over its age: an SWA copy unlocks ``(depth+1)*B`` prefix
        tokens while the compressed block at its node is cached on either tier (the device's rule);
        compressed copies are all worth the same (plain LRU)."""
        if owner != SWA:
            return 0.0
        node, index = self._copies[owner][page], self.index
        if index.comp[node] < 0 and index.host_comp[node] < 0:
            return 0.0
        return (index.depth[node] + 1) * self.block_size / (self._clock - self._used_at[owner][page] + 1)

    def drop(self, owner: Owner, page: int) -> None:
        """Forget the copy on host page ``page`` (its node loses the reference)."""
        node = self._copies[owner].pop(page)
        del self._used_at[owner][page]
        self._at[owner][node] = -1
        if owner == SWA:
            self.next_token.pop(page, None)
        self._stores[owner].pop(page, None)  # a store into it this step is moot now
        self._lists[owner].free(page)
        self.index.unref(node)

    def clear(self) -> int:
        """Drop every copy (a prefix-cache reset); returns how many."""
        n = 0
        for owner in (SWA, COMPRESS):
            for page in list(self._copies[owner]):
                self.drop(owner, page)
                n += 1
        return n

    def _touch(self, owner: Owner, page: int) -> None:
        copies = self._copies[owner]
        copies[page] = copies.pop(page)  # to the most recently used end
        self._used_at[owner][page] = self._tick()

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    # ---- integrity ----------------------------------------------------------------------------
    def check_integrity(self) -> None:
        """Chunks conserved, one owner per chunk; every used host page holds exactly one copy, whose
        node is indexed and points back at it; pending loads read live copies."""
        self.chunks.check_integrity()
        owned = 0
        for owner, lst in self._lists.items():
            lst.check_integrity()
            owned += len(lst.owned_chunks())
            copies = self._copies[owner]
            assert lst.num_used() == len(copies), f"host {owner}: {lst.num_used()} pages used, {len(copies)} copies"
            assert set(copies) == set(self._used_at[owner]), f"host {owner}: LRU clocks drifted"
            for page, node in copies.items():
                assert lst.owns_chunk(page // lst.pages_per_chunk), f"host {owner}: page {page} in a chunk it does not own"
                assert self._at[owner][node] == page, f"host {owner}: node {node} does not point at page {page}"
                assert self.index.holds(node), f"host {owner}: copy on page {page} hangs on a dropped node"
            for page in self._stores[owner]:
                assert page in copies, f"host {owner}: store into page {page} that holds no copy"
        for owner, page in self._loading:
            assert page in self._copies[owner], f"host {owner}: pending load of page {page} that holds no copy"
        assert owned + self.chunks.num_free() == self.num_chunks, "host chunks not conserved"
        assert set(self.next_token) <= set(self._copies[SWA]), "host next-token of a dropped SWA copy"
