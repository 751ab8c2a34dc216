"""The arenas the trace simulator compares against this project's elastic arena.

Every class here has the interface that :class:`~atom.kv.block_manager.BlockManager` and
its pools use on :class:`~atom.kv.unified_kv_arena.UnifiedKvArena` (``alloc`` / ``free`` /
``page`` / ``can_alloc`` / ``chunks_needed`` / ``chunk_of`` / ``chunk_used_pages`` /
``lends_between_owners`` ...), so the *same* block manager and scheduler run over each of them:

- :class:`SplitKvArena`: two fixed pools (SWA / compressed) at a byte share of one budget, each its
  own :class:`ChunkArena` of exact-size pages (no padding), plus a fixed pool of ``max_num_seqs``
  request states. ``lends_between_owners`` is False: a page one pool frees can never serve another.
- :func:`atom_style_layout`: an ATOM-style arena (one chunk = one SWA block in every layer's slice,
  uniform chunk count per ratio group; a compressed page needs a page in every compressed group, so
  the c4 group bounds the pages per chunk) with ATOM's fixed pool of ``max_num_seqs`` request states.
  Sizes come from :func:`atom.bench.capacity.atom_style_chunks`; the arena itself is the real
  :class:`UnifiedKvArena` over that layout (``reserved_state_slots``).
- :func:`reserved_state_layout`: this project's elastic arena as it was before request state became
  arena pages: a fixed pool of ``max_num_seqs`` request states of the old size (CSA rings plus a
  ``ratio``-row HCA ring per HCA layer, :func:`atom.bench.capacity.ring_state_bytes`: 11.6 MiB on
  V4-Flash) taken off the budget first, the same chunk geometry over the rest. It is the "before"
  of the state owner, run on the same trace.
- :class:`OracleKvArena`: the byte-granular bound. Every page (a request's state included) costs its
  exact bytes from one shared budget and is its own chunk, so nothing is padded and any freed byte
  serves any owner.

Every design gets the same KV budget. The elastic arena and the oracle hold request state in it as
pages of the ``state`` owner; the fixed split and the ATOM-style arena take their fixed state pool
off it first (:func:`usable_bytes`), as those designs do.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from atom.bench.capacity import atom_style_chunks, ring_state_bytes
from atom.config import CacheConfig
from atom.kv.block_manager import BlockManager
from atom.kv.chunk_arena import ChunkArena, ChunkBackedFreeList
from atom.kv.kv_layout import KvLayout
from atom.kv.page_map import COMPRESS, OWNERS, STATE, SWA, LogicalPageMap

if TYPE_CHECKING:
    from atom.bench.simulate import SimConfig

__all__ = ["Policy", "ARENA", "ARENA_HOST", "ARENA_RESERVED", "ARENA_POLICIES", "OTHER_POLICIES", "fixed", "build_block_manager", "PoolSizedLayout", "SplitKvArena", "OracleKvArena", "atom_style_layout", "reserved_state_layout", "split_arena",
           "oracle_arena", "usable_bytes", "exact_page_bytes"]


def usable_bytes(layout: KvLayout) -> int:
    """The KV bytes a fixed-pool design shares out: the budget minus a fixed pool of
    ``max_live_requests`` request states (the reservation the elastic arena does not make)."""
    return layout.kv_cache_bytes - layout.max_live_requests * layout.spec.request_state_bytes


def exact_page_bytes(layout: KvLayout) -> dict[str, int]:
    """Exact (unpadded) bytes of one page of each owner: what counts as holding memory."""
    spec = layout.spec
    return {SWA: spec.swa_block_bytes, COMPRESS: spec.compressed_block_bytes, STATE: spec.request_state_bytes}


@dataclass(frozen=True)
class PoolSizedLayout(KvLayout):
    """A :class:`KvLayout` whose logical id counts are given, not derived from chunks.

    The block manager sizes its id spaces (and the SWA pin cap) from ``max_swa_pages`` /
    ``max_compressed_pages``; a fixed split or the oracle has its own page counts per owner.
    """

    swa_pages: int = 0
    compress_pages: int = 0

    @property
    def max_swa_pages(self) -> int:  # type: ignore[override]
        return self.swa_pages

    @property
    def max_compressed_pages(self) -> int:  # type: ignore[override]
        return self.compress_pages


def _pool_layout(base: KvLayout, swa_pages: int, compress_pages: int, reserved: int) -> PoolSizedLayout:
    return PoolSizedLayout(base.spec, base.kv_cache_bytes, base.max_live_requests, 1, 1,
                           base.spec.swa_block_bytes, 0, reserved, swa_pages=swa_pages, compress_pages=compress_pages)


class _PagedArena(LogicalPageMap):
    """Arenas whose pages are their own chunks; subclasses decide where a page's memory comes from."""

    layout: KvLayout

    def __init__(self, layout: KvLayout) -> None:
        super().__init__()
        self.layout = layout

    def pages_per_chunk(self, owner: str) -> int:
        return 1

    def chunk_of(self, owner: str, page: int) -> int:
        return page

    def chunk_used_pages(self, owner: str, page: int) -> int:
        return 1

    def chunk_pages_used(self, owner: str, chunk: int) -> int:
        return 1


class SplitKvArena(_PagedArena):
    """Fixed pools: ``swa_pages`` SWA pages, ``compress_pages`` compressed pages and
    ``layout.max_live_requests`` state pages, never lent.

    Contract: a pool's pages serve only its owner; ``chunks_needed`` counts the pages an allocation
    lacks in its own pool and ``can_alloc`` is true only when neither pool lacks any, so the block
    manager evicts (own cache only) exactly when the owner's pool is full.
    """

    def __init__(self, layout: KvLayout, swa_pages: int, compress_pages: int) -> None:
        super().__init__(layout)
        self._arenas = {SWA: ChunkArena(swa_pages), COMPRESS: ChunkArena(compress_pages),
                        STATE: ChunkArena(layout.max_live_requests)}
        self._lists = {o: ChunkBackedFreeList(self._arenas[o], 1, o) for o in OWNERS}

    @property
    def lends_between_owners(self) -> bool:
        """Always False: the pools are separate memory."""
        return False

    def capacity(self, owner: str) -> int:
        return self._arenas[owner].num_chunks

    def num_used(self, owner: str) -> int:
        return self._lists[owner].num_used()

    def num_free_chunks(self) -> int:
        return sum(a.num_free() for a in self._arenas.values())

    def owned_chunks(self, owner: str) -> int:
        return self.num_used(owner)

    def available(self, owner: str) -> int:
        return self._lists[owner].available()

    def chunks_needed(self, swa: int = 0, compress: int = 0, state: int = 0) -> int:
        """Pages the allocation lacks in its own pools (0: it fits)."""
        return sum(max(0, n - self.available(o)) for o, n in ((SWA, swa), (COMPRESS, compress), (STATE, state)))

    def can_alloc(self, swa: int = 0, compress: int = 0, state: int = 0) -> bool:
        return self.chunks_needed(swa, compress, state) == 0

    def fits_after_eviction(self, swa: int, compress: int, state: int, kept: dict[str, tuple[int, int]]) -> bool:
        return all(kept[o][0] + n <= self.capacity(o) for o, n in ((SWA, swa), (COMPRESS, compress), (STATE, state)))

    def _shortfall(self, swa: int, compress: int, state: int) -> str:
        return (f"fixed split: {swa} SWA pages ({self.available(SWA)} free) + "
                f"{compress} compressed pages ({self.available(COMPRESS)} free) + "
                f"{state} state pages ({self.available(STATE)} free) do not fit")

    def _take_page(self, owner: str) -> int:
        return self._lists[owner].pop()

    def _give_back(self, owner: str, page: int) -> None:
        self._lists[owner].free(page)

    def check_integrity(self) -> None:
        self._check_maps()
        for owner in OWNERS:
            self._arenas[owner].check_integrity()
            self._lists[owner].check_integrity()
            used = self.num_mapped(owner) + self.num_unmapped(owner)
            assert used == self.num_used(owner)
            assert used + self._arenas[owner].num_free() == self.capacity(owner)


class OracleKvArena(_PagedArena):
    """Byte-granular bound: each page costs its exact block bytes from one budget of ``budget`` bytes.

    Contract: an allocation fits iff the bytes in use plus its exact bytes are within the budget;
    freed bytes serve either owner at once (``lends_between_owners``), and no byte is padding.
    ``chunks_needed`` counts every new page (each page is its own chunk), so the block manager's
    make-room loop treats every requesting owner as short and evicts only while the bytes do not fit.
    """

    def __init__(self, layout: KvLayout, budget: int) -> None:
        super().__init__(layout)
        self.budget = budget
        self.cost = exact_page_bytes(layout)
        self.used_bytes = 0
        self._free_pages: dict[str, list[int]] = {owner: [] for owner in OWNERS}
        self._next_page = {owner: 0 for owner in OWNERS}
        self._num_used = {owner: 0 for owner in OWNERS}

    @property
    def lends_between_owners(self) -> bool:
        return True

    def free_bytes(self) -> int:
        return self.budget - self.used_bytes

    def bytes_for(self, swa: int = 0, compress: int = 0, state: int = 0) -> int:
        return swa * self.cost[SWA] + compress * self.cost[COMPRESS] + state * self.cost[STATE]

    def num_used(self, owner: str) -> int:
        return self._num_used[owner]

    def num_free_chunks(self) -> int:
        return self.free_bytes() // min(self.cost.values())

    def owned_chunks(self, owner: str) -> int:
        return self.num_used(owner)

    def available(self, owner: str) -> int:
        return self.free_bytes() // self.cost[owner]

    def chunks_needed(self, swa: int = 0, compress: int = 0, state: int = 0) -> int:
        return swa + compress + state

    def can_alloc(self, swa: int = 0, compress: int = 0, state: int = 0) -> bool:
        return self.bytes_for(swa, compress, state) <= self.free_bytes()

    def fits_after_eviction(self, swa: int, compress: int, state: int, kept: dict[str, tuple[int, int]]) -> bool:
        return self.bytes_for(swa + kept[SWA][0], compress + kept[COMPRESS][0], state + kept[STATE][0]) <= self.budget

    def _shortfall(self, swa: int, compress: int, state: int) -> str:
        return f"oracle: {self.bytes_for(swa, compress, state)} B needed, {self.free_bytes()} B free"

    def _take_page(self, owner: str) -> int:
        if self._free_pages[owner]:
            page = self._free_pages[owner].pop()
        else:
            page = self._next_page[owner]
            self._next_page[owner] += 1
        self.used_bytes += self.cost[owner]
        self._num_used[owner] += 1
        return page

    def _give_back(self, owner: str, page: int) -> None:
        self._free_pages[owner].append(page)
        self.used_bytes -= self.cost[owner]
        self._num_used[owner] -= 1

    def check_integrity(self) -> None:
        assert 0 <= self.used_bytes <= self.budget, f"oracle uses {self.used_bytes} of {self.budget} B"
        assert self.used_bytes == sum(self.num_used(o) * self.cost[o] for o in OWNERS)
        self._check_maps()
        for owner in OWNERS:
            pages = list(self.mapping(owner).values())
            assert self.num_used(owner) == len(pages) + self.num_unmapped(owner), f"{owner}: used pages miscounted"
            assert not set(pages) & set(self._free_pages[owner]), f"{owner}: a used page is on the free list"


def split_arena(layout: KvLayout, swa_share: float) -> tuple[PoolSizedLayout, SplitKvArena]:
    """A fixed split of :func:`usable_bytes` with ``swa_share`` of the bytes for SWA pages."""
    if not 0.0 < swa_share < 1.0:
        raise ValueError(f"swa_share={swa_share} must be in (0, 1)")
    usable, cost = usable_bytes(layout), exact_page_bytes(layout)
    swa_pages = int(usable * swa_share) // cost[SWA]
    comp_pages = int(usable * (1.0 - swa_share)) // cost[COMPRESS]
    lay = _pool_layout(layout, swa_pages, comp_pages, layout.max_live_requests)
    return lay, SplitKvArena(lay, swa_pages, comp_pages)


def oracle_arena(layout: KvLayout) -> tuple[PoolSizedLayout, OracleKvArena]:
    """The byte-granular oracle over the whole budget (id spaces sized for either KV owner alone)."""
    budget, cost = layout.kv_cache_bytes, exact_page_bytes(layout)
    lay = _pool_layout(layout, budget // cost[SWA], budget // cost[COMPRESS], 0)
    return lay, OracleKvArena(lay, budget)


def atom_style_layout(layout: KvLayout) -> KvLayout:
    """An ATOM-style layout: a fixed pool of ``max_live_requests`` request states, then one SWA page
    per chunk, the chunk count and compressed pages per chunk of
    :func:`atom.bench.capacity.atom_style_chunks` over the rest."""
    usable = usable_bytes(layout)
    chunks, k = atom_style_chunks(layout.spec, usable)
    return KvLayout(layout.spec, layout.kv_cache_bytes, layout.max_live_requests, 1, k, usable // chunks, chunks,
                    reserved_state_slots=layout.max_live_requests)


def reserved_state_layout(layout: KvLayout) -> KvLayout:
    """The elastic arena before the state owner: ``max_live_requests`` request states of
    :func:`ring_state_bytes` reserved up front, whatever runs; the same chunks over the rest."""
    reserved = layout.max_live_requests * ring_state_bytes(layout.spec)
    chunks = (layout.kv_cache_bytes - reserved) // layout.chunk_bytes
    if chunks <= 0:
        raise ValueError(f"{layout.max_live_requests} reserved request states of {ring_state_bytes(layout.spec)} B "
                         f"leave no chunk of a {layout.kv_cache_bytes} B budget")
    return replace(layout, num_chunks=chunks, reserved_state_slots=layout.max_live_requests)


# ---- policies: which arena (and which retention flags) the block manager runs over ----------
@dataclass(frozen=True)
class Policy:
    """One way of managing the same KV bytes. ``kind``: arena | reserved | split | atom | oracle."""

    name: str
    kind: str
    swa_share: float = 0.0
    full_retain: bool = False
    retention_interval: int = 0
    host_tier: bool = False  # the block manager gets the host tier of ``SimConfig.host_kv_bytes``


ARENA = Policy("arena", "arena")
ARENA_POLICIES = (ARENA, Policy("arena+retain", "arena", full_retain=True),
                  Policy("arena+interval", "arena", full_retain=True, retention_interval=32768))
#: the elastic arena (default flags) over the host tier (run when ``SimConfig.host_kv_bytes`` > 0)
ARENA_HOST = Policy("arena+host", "arena", host_tier=True)
#: the elastic arena with the request-state reservation made before the state owner (default flags)
ARENA_RESERVED = Policy("arena-reserved-state", "reserved")
OTHER_POLICIES = (Policy("atom-style", "atom"), Policy("atom-style+retain", "atom", full_retain=True),
                  Policy("oracle", "oracle"), Policy("oracle+retain", "oracle", full_retain=True), ARENA_RESERVED)


def fixed(share: float, retain: bool = False) -> Policy:
    """The fixed split at SWA byte share ``share`` (``retain``: with ATOM_SWA_FULL_RETAIN semantics)."""
    return Policy(f"fixed-{share:g}" + ("+retain" if retain else ""), "split", swa_share=share, full_retain=retain)


def build_block_manager(policy: Policy, layout: KvLayout, cfg: "SimConfig") -> BlockManager:
    """The real block manager over the arena ``policy`` names, with its flags as CacheConfig fields."""
    host = {"host_kv_cache_bytes": cfg.host_kv_bytes} if policy.host_tier and cfg.host_kv_bytes else {}
    cache = CacheConfig(kv_cache_bytes=cfg.budget_bytes, enable_prefix_caching=cfg.prefix_caching,
                        swa_full_retain=policy.full_retain, swa_retention_interval=policy.retention_interval, **host)
    if policy.kind == "arena":
        return BlockManager(layout, cache)
    if policy.kind == "reserved":
        return BlockManager(reserved_state_layout(layout), cache)
    if policy.kind == "atom":
        atom = atom_style_layout(layout)
        return BlockManager(atom, cache)
    if policy.kind == "split":
        lay, arena = split_arena(layout, policy.swa_share)
        return BlockManager(lay, cache, arena=arena)
    if policy.kind == "oracle":
        lay, arena = oracle_arena(layout)
        return BlockManager(lay, cache, arena=arena)
    raise ValueError(f"unknown policy kind {policy.kind!r}")
