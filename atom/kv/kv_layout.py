"""Sizing the KV arena: a pure function from (KV spec, byte budget) to a layout.

One flat byte buffer is cut into ``num_chunks`` equal chunks. A chunk spans **all layers**. Three
owners borrow chunks: SWA, compressed and ``state`` (the live compressor state of admitted requests,
``s`` whole request-state pages per chunk; see :mod:`atom.kv.state_layout`):

    SWA-owned chunk (m SWA pages; page p starts at byte p * swa_page_bytes of the buffer)
    +-- page 0 ----------------------------------------------------------------+-- page 1 ...
    | L0: B rows | L1: B rows | ... | Ln: B rows | CSA state of each c4 layer | pad |
    +--------------------------------------------------------------------------+
    (CSA state of one c4 layer = 4 overlap rows x [main kv | main score | idx kv | idx score], fp32)

    compress-owned chunk (k compressed pages, laid out layer by layer)
    +-------------------------------------------------------------------------------------+
    | Lc1 main rows of pages 0..k-1 | Lc2 main ... | c4 indexer rows of pages 0..k-1 | pad |
    +-------------------------------------------------------------------------------------+

So an owner never holds bytes that some of its layers cannot use (docs/prior_art.md measures a
per-layer layout that does). The SWA page count
per chunk ``m`` is *chosen*: with one SWA page per chunk the compressed pages leave a remainder
(V4-Flash fp8: 8 pages fill 95.0%); ``m`` is the smallest value whose compressed packing reaches the
target.

Addressing contract (what the kernels compute; all views are 2D ``rows[num_rows, row_bytes]``
starting at :attr:`RowRegion.offset`):

    row(page, slot) = (page // pages_per_chunk) * chunk_rows + (page % pages_per_chunk) * page_rows + slot

For SWA rows this reduces to ``page * row_stride + pos % block_size`` (``row_stride`` =
``page_rows``, distinct from ``block_size``). Row sizes divide the page and chunk strides (the SWA
page is padded by at most a few KiB to make that true).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import NamedTuple

from atom.config import CacheConfig, Dsv4KvSpec, SchedulerConfig
from atom.kv_group import CSA_OVERLAP_ROWS, group_of_ratio, is_csa
from atom.kv.state_layout import StatePart, state_pages_per_chunk, state_parts
from atom.validation import require_int

__all__ = ["ArenaGroupSpec", "RowRegion", "CsaStateRegion", "KvLayout", "plan_kv_layout", "ChunkShape",
           "chunk_shape", "InsufficientKvMemory", "choose_chunk_pages"]

_FP32 = 4  # bytes
_ALIGN = 8  # every region starts 8-byte aligned so fp32 / bf16 / uint8 views are all legal


class InsufficientKvMemory(ValueError):
    """The byte budget cannot hold even one request of the maximum length."""


@dataclass(frozen=True)
class RowRegion:
    """Where one layer's rows of one kind live, for building a 2D row view over the buffer."""

    layer: int
    kind: str  # "swa" | "compressed" | "index"
    offset: int  # byte offset of row 0 in the buffer
    row_bytes: int
    pages_per_chunk: int
    chunk_rows: int  # rows between the same page slot of consecutive chunks
    page_rows: int  # rows between consecutive pages of one chunk (SWA: row_stride)
    used_rows: int  # rows of a page that hold data (SWA: block_size; compressed: entries per block)
    num_rows: int  # rows the view spans (from offset to the end of the buffer)

    def row(self, page: int, slot: int) -> int:
        assert 0 <= slot < self.used_rows, f"slot {slot} outside 0..{self.used_rows - 1}"
        chunk, local = divmod(page, self.pages_per_chunk)
        return chunk * self.chunk_rows + local * self.page_rows + slot


@dataclass(frozen=True)
class CsaStateRegion:
    """The fused CSA boundary state of one c4 layer inside every SWA page (fp32, 4 rows each)."""

    layer: int
    offset: int  # byte offset of SWA page 0's state block for this layer
    page_stride: int  # bytes between consecutive SWA pages
    main_width: int  # 2 * head_dim
    index_width: int  # 2 * index_head_dim

    @property
    def parts(self) -> dict[str, tuple[int, int]]:
        """name -> (byte offset relative to :attr:`offset`, width in fp32 elements)."""
        m, i = CSA_OVERLAP_ROWS * self.main_width * _FP32, CSA_OVERLAP_ROWS * self.index_width * _FP32
        return {"main_kv": (0, self.main_width), "main_score": (m, self.main_width),
                "index_kv": (2 * m, self.index_width), "index_score": (2 * m + i, self.index_width)}


@dataclass(frozen=True)
class ArenaGroupSpec:
    """How one ratio group (``dense``, ``c4``, ``c128`` ...) lays out its layers inside a chunk."""

    name: str
    ratio: int
    layers: tuple[int, ...]
    entries_per_block: int
    swa_offsets: tuple[int, ...]  # per layer, inside an SWA page
    compressed_offsets: tuple[int, ...]  # per layer, inside a compress-owned chunk (empty for dense)
    index_offsets: tuple[int, ...]  # per layer (c4 only)
    csa_state_offs: tuple[int, ...]  # per layer, inside an SWA page (c4 only)


def _round_up(x: int, unit: int) -> int:
    return -(-x // unit) * unit


def _swa_page_bytes(spec: Dsv4KvSpec, m: int) -> int:
    """Exact SWA block bytes padded so rows tile the page and index rows tile the chunk."""
    r, ri = spec.main_row_bytes, spec.index_row_bytes
    unit = math.lcm(r, _ALIGN)
    if spec.csa_layers:
        unit = math.lcm(unit, ri // math.gcd(m, ri))
    return _round_up(spec.swa_block_bytes, unit)


def _compress_chunk_bytes(spec: Dsv4KvSpec, k: int) -> int:
    """Bytes the layer-major compressed layout of ``k`` pages needs inside one chunk."""
    total = 0
    for layer in spec.compressed_layers:
        total = _round_up(total, _ALIGN) + k * spec.entries_per_block(layer) * spec.main_row_bytes
    for layer in spec.csa_layers:
        total = _round_up(total, _ALIGN) + k * spec.entries_per_block(layer) * spec.index_row_bytes
    return total


def _pages_that_fit(spec: Dsv4KvSpec, chunk_bytes: int) -> int:
    k = chunk_bytes // spec.compressed_block_bytes if spec.compressed_block_bytes else 0
    while k > 0 and _compress_chunk_bytes(spec, k) > chunk_bytes:
        k -= 1
    return k


def choose_chunk_pages(spec: Dsv4KvSpec, target: float, max_pages: int) -> int:
    """Smallest SWA pages per chunk whose compressed packing efficiency reaches ``target``
    (the best one up to ``max_pages`` if none does). Models without compressed layers use 1."""
    if not spec.compressed_layers:
        return 1
    best, best_eff = 1, -1.0
    for m in range(1, max_pages + 1):
        chunk = m * _swa_page_bytes(spec, m)
        eff = _pages_that_fit(spec, chunk) * spec.compressed_block_bytes / chunk
        if eff >= target:
            return m
        if eff > best_eff + 1e-12:
            best, best_eff = m, eff
    return best


@dataclass(frozen=True)
class KvLayout:
    """The result of sizing: chunk geometry, counts, and per-layer row regions.

    ``max_live_requests`` (the scheduler's ``max_num_seqs``) only sizes the runner's per-request
    tables: live compressor state is memory of the arena's ``state`` owner, taken per admitted
    request. ``reserved_state_slots`` > 0 describes the older design instead (a fixed pool of that
    many request states outside the chunks, taken off the budget first); the simulator and the
    capacity report use it to compare against, the engine runs with 0.
    """

    spec: Dsv4KvSpec
    kv_cache_bytes: int  # the whole budget (chunks + any reserved state pool)
    max_live_requests: int
    chunk_pages: int  # m: SWA pages per chunk
    compress_pages_per_chunk: int  # k
    swa_page_bytes: int
    num_chunks: int
    reserved_state_slots: int = 0

    @classmethod
    def for_chunks(cls, spec: Dsv4KvSpec, num_chunks: int, limits: SchedulerConfig,
                   cache: CacheConfig | None = None) -> "KvLayout":
        """The layout with exactly ``num_chunks`` arena chunks; its ``kv_cache_bytes`` is the
        smallest budget that gives them (whole chunks), so :func:`plan_kv_layout` with that budget
        returns the same layout. Tests and benchmarks size arenas in chunks with it. ``cache``
        supplies the chunk-shape settings (its ``kv_cache_bytes`` is ignored)."""
        require_int("num_chunks", num_chunks, 0)
        geometry = chunk_shape(spec, cache or CacheConfig())
        m, spb, _ = geometry
        return _layout_with_chunks(spec, geometry, num_chunks * m * spb, num_chunks, limits)

    @property
    def chunk_bytes(self) -> int:
        return self.chunk_pages * self.swa_page_bytes

    @property
    def arena_bytes(self) -> int:
        return self.num_chunks * self.chunk_bytes

    @property
    def state_pool_bytes(self) -> int:
        """Bytes of a reserved state pool outside the chunks (0 in the elastic arena)."""
        return self.reserved_state_slots * self.spec.request_state_bytes

    @property
    def state_pages_per_chunk(self) -> int:
        """Request-state pages in a chunk lent to the state owner (0: the model keeps no state)."""
        return state_pages_per_chunk(self.chunk_bytes, self.spec.request_state_bytes)

    @property
    def state_page_bytes(self) -> int:
        """Stride between state pages: ``chunk_bytes / state_pages_per_chunk`` (they tile chunks)."""
        s = self.state_pages_per_chunk
        return self.chunk_bytes // s if s else 0

    @property
    def max_state_pages(self) -> int:
        return self.num_chunks * self.state_pages_per_chunk

    @property
    def state_packing(self) -> float:
        """Share of a state-owned chunk holding request state (the rest is padding)."""
        s = self.state_pages_per_chunk
        return s * self.spec.request_state_bytes / self.chunk_bytes if s else 0.0

    @property
    def max_swa_pages(self) -> int:
        return self.num_chunks * self.chunk_pages

    @property
    def max_compressed_pages(self) -> int:
        return self.num_chunks * self.compress_pages_per_chunk

    # ---- efficiency ---------------------------------------------------------------------------
    @property
    def swa_packing(self) -> float:
        """Share of an SWA-owned chunk holding SWA rows or CSA state (the rest is padding)."""
        return self.spec.swa_block_bytes / self.swa_page_bytes

    @property
    def compressed_packing(self) -> float:
        """Share of a compress-owned chunk holding compressed rows and indexer keys."""
        if not self.compress_pages_per_chunk:
            return 0.0
        return self.compress_pages_per_chunk * self.spec.compressed_block_bytes / self.chunk_bytes

    @property
    def budget_remainder(self) -> float:
        """Share of the budget left over after whole chunks (and any reserved state pool)."""
        return (self.kv_cache_bytes - self.state_pool_bytes - self.arena_bytes) / self.kv_cache_bytes

    # ---- regions ------------------------------------------------------------------------------
    @cached_property
    def _swa_offsets(self) -> dict[int, int]:
        b, r = self.spec.block_size, self.spec.main_row_bytes
        return {layer: layer * b * r for layer in range(self.spec.num_layers)}

    @cached_property
    def _csa_state_offsets(self) -> dict[int, int]:
        base = self.spec.num_layers * self.spec.block_size * self.spec.main_row_bytes
        return {layer: base + i * self.spec.csa_state_bytes for i, layer in enumerate(self.spec.csa_layers)}

    @cached_property
    def _compressed_offsets(self) -> tuple[dict[int, int], dict[int, int]]:
        spec, k = self.spec, self.compress_pages_per_chunk
        main, index, total = {}, {}, 0
        for layer in spec.compressed_layers:
            total = _round_up(total, _ALIGN)
            main[layer] = total
            total += k * spec.entries_per_block(layer) * spec.main_row_bytes
        for layer in spec.csa_layers:
            total = _round_up(total, _ALIGN)
            index[layer] = total
            total += k * spec.entries_per_block(layer) * spec.index_row_bytes
        assert total <= self.chunk_bytes, "compressed layout overflows the chunk"
        return main, index

    def swa_rows(self, layer: int) -> RowRegion:
        r = self.spec.main_row_bytes
        off = self._swa_offsets[layer]
        stride = self.swa_page_bytes // r
        return RowRegion(layer, "swa", off, r, self.chunk_pages, self.chunk_pages * stride, stride,
                         self.spec.block_size, (self.arena_bytes - off) // r)

    def compressed_rows(self, layer: int) -> RowRegion:
        return self._compressed_region(layer, "compressed", self._compressed_offsets[0], self.spec.main_row_bytes)

    def index_rows(self, layer: int) -> RowRegion:
        return self._compressed_region(layer, "index", self._compressed_offsets[1], self.spec.index_row_bytes)

    def _compressed_region(self, layer: int, kind: str, offsets: dict[int, int], row_bytes: int) -> RowRegion:
        if layer not in offsets:
            raise KeyError(f"layer {layer} (ratio {self.spec.compress_ratios[layer]}) has no {kind} rows")
        off, epb = offsets[layer], self.spec.entries_per_block(layer)
        assert self.chunk_bytes % row_bytes == 0
        return RowRegion(layer, kind, off, row_bytes, self.compress_pages_per_chunk,
                         self.chunk_bytes // row_bytes, epb, epb, (self.arena_bytes - off) // row_bytes)

    def csa_state(self, layer: int) -> CsaStateRegion:
        if layer not in self._csa_state_offsets:
            raise KeyError(f"layer {layer} is not a CSA layer; only c4 layers carry boundary state")
        return CsaStateRegion(layer, self._csa_state_offsets[layer], self.swa_page_bytes,
                              2 * self.spec.head_dim, 2 * self.spec.index_head_dim)

    def state_parts(self, layer: int) -> dict[str, StatePart]:
        """The state parts of ``layer`` inside a state page (``KeyError`` for a layer without state)."""
        parts = {p.name: p for p in self._state_parts if p.layer == layer}
        if not parts:
            raise KeyError(f"layer {layer} (ratio {self.spec.compress_ratios[layer]}) keeps no compressor state")
        return parts

    @cached_property
    def _state_parts(self) -> tuple[StatePart, ...]:
        return state_parts(self.spec)

    def group_specs(self) -> dict[str, ArenaGroupSpec]:
        """The layout grouped by ratio (``dense`` / ``c4`` / ``c128`` ...)."""
        groups: dict[str, list[int]] = {}
        for layer, ratio in enumerate(self.spec.compress_ratios):
            groups.setdefault(group_of_ratio(ratio), []).append(layer)
        main, index = self._compressed_offsets
        out = {}
        for name, layers in groups.items():
            ratio = self.spec.compress_ratios[layers[0]]
            out[name] = ArenaGroupSpec(
                name, ratio, tuple(layers), self.spec.entries_per_block(layers[0]),
                tuple(self._swa_offsets[lay] for lay in layers),
                tuple(main[lay] for lay in layers if lay in main),
                tuple(index[lay] for lay in layers if lay in index),
                tuple(self._csa_state_offsets[lay] for lay in layers if is_csa(ratio)))
        return out


def request_chunks_needed(layout_k: int, spec: Dsv4KvSpec, max_model_len: int) -> int:
    """Chunks one request of ``max_model_len`` tokens needs, running alone: its window's SWA pages
    (plus the block being written), one chunk each, every compressed block, packed, and its
    compressor-state page.

    One chunk per SWA page because the request's own published SWA blocks stay cached beside its
    live ones (retained windows, full retain, pins): a chunk holding one live page and cached ones
    can never be lent, so the live pages may end up one per chunk. Its compressed blocks are all
    held to the end, so alone on an emptied arena they pack (the scheduler restarts a request that
    cannot progress alone in exactly that state)."""
    chunks = spec.tail_blocks + 1 + (1 if spec.request_state_bytes else 0)
    if spec.compressed_layers:
        comp_pages = -(-max_model_len // spec.block_size)
        chunks += -(-comp_pages // layout_k)
    return chunks


class ChunkShape(NamedTuple):
    """The shape of one arena chunk, fixed by the spec and the cache settings (not the budget)."""

    chunk_pages: int  # m: SWA pages per chunk
    swa_page_bytes: int
    compress_pages_per_chunk: int  # k


def chunk_shape(spec: Dsv4KvSpec, cache: CacheConfig) -> ChunkShape:
    """The chunk shape ``spec`` gets under ``cache`` (``chunk_pages`` 0 = choose by packing)."""
    if cache.block_size and cache.block_size != spec.block_size:
        raise ValueError(f"block_size={cache.block_size} but the KV spec was built with block_size="
                         f"{spec.block_size}; build the spec from the cache config")
    m = cache.chunk_pages or choose_chunk_pages(spec, cache.packing_target, cache.max_chunk_pages)
    spb = _swa_page_bytes(spec, m)
    if not cache.chunk_pages:  # a chunk must hold at least one request's compressor state
        while spec.request_state_bytes and not state_pages_per_chunk(m * spb, spec.request_state_bytes):
            m += 1
            spb = _swa_page_bytes(spec, m)
    k = _pages_that_fit(spec, m * spb)
    if spec.compressed_layers and k == 0:
        raise ValueError(f"chunk_pages={m} gives chunks too small for one compressed block")
    if spec.request_state_bytes and not state_pages_per_chunk(m * spb, spec.request_state_bytes):
        raise ValueError(f"chunk_pages={m} gives chunks of {m * spb} B, too small for one request's "
                         f"compressor state ({spec.request_state_bytes} B); use more pages per chunk (or 0 = choose)")
    return ChunkShape(m, spb, k)


def _layout_with_chunks(spec: Dsv4KvSpec, geometry: ChunkShape, budget: int, num_chunks: int,
                        limits: SchedulerConfig) -> KvLayout:
    m, spb, k = geometry
    need_chunks = request_chunks_needed(k, spec, limits.max_model_len)
    if num_chunks < need_chunks:
        need = need_chunks * m * spb
        raise InsufficientKvMemory(
            f"KV cache budget {budget} B ({budget / 2**30:.3f} GiB) cannot hold one request "
            f"of {limits.max_model_len} tokens: it needs at least {need} B ({need / 2**30:.3f} GiB) = "
            f"{need_chunks} chunks of {m * spb} B (its window, its compressed blocks and its compressor "
            f"state). Raise the KV memory, or lower max_model_len.")
    return KvLayout(spec, budget, limits.max_num_seqs, m, k, spb, num_chunks)


def plan_kv_layout(spec: Dsv4KvSpec, cache: CacheConfig, limits: SchedulerConfig) -> KvLayout:
    """Size the arena for ``spec`` inside ``cache.kv_cache_bytes``: the whole budget becomes chunks.

    Nothing is reserved per live request: each admitted request's compressor state is a page of the
    arena's ``state`` owner, so ``limits.max_num_seqs`` is a scheduling limit only. Raises
    :class:`InsufficientKvMemory` (saying how many bytes are needed) when one request of
    ``limits.max_model_len`` tokens would not fit. The sizes themselves were validated by the two
    configs.
    """
    geometry = chunk_shape(spec, cache)
    m, spb, _ = geometry
    num_chunks = cache.kv_cache_bytes // (m * spb)
    return _layout_with_chunks(spec, geometry, cache.kv_cache_bytes, num_chunks, limits)

