"""Per-sequence cache of the reference model: plain tensors, one ``LayerCache`` per block (MTP included).

Layout per layer (``c`` = head_dim, ``cI`` = index_head_dim, ``m`` = compression ratio, ``W`` = window)::

    swa            [W, c]              ring, slot = pos % W; post-norm, post-RoPE, post-round-trip KV rows
    entries        [cap // m, c]       compressed entries (CSA/HCA), entry i written once at token (i+1)m-1
    state          CompressorState     CSA: kv/score [8, 2c], slot = pos % 8; HCA: [m, c], slot = pos % m
    index_keys     [cap // 4, cI]      lightning-indexer keys (CSA only), same indexing as entries
    index_state    CompressorState     CSA only: [8, 2cI], slot = pos % 8

Compressor state rows hold the raw fp32 projections ``kv`` and ``score + ape[pos % m]`` of one token each.  A CSA
entry i pools the "b" half (``[:c]``) of block i-1's rows and the "a" half (``[c:]``) of block i's rows.

At ``P`` tokens the state that a continuation reads (the section 4.2 boundary state) is: SWA rows of positions
``max(0, P-W+1) .. P-1``; entries ``0 .. P//m - 1`` (and indexer keys); compressor rows of the partial block
``[m*(P//m), P-1]`` plus, on CSA layers, the previous complete block.  ``snapshot`` copies exactly that and
``restore`` writes it into another cache (e.g. one poisoned with NaN), so any read of unsaved state shows.

A fresh cache has compressor state kv = 0, score = -inf (``reset``), so every new sequence starts clean.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from atom.kv_group import CSA_OVERLAP_ROWS, CSA_STATE_RING, is_csa, state_ring_rows

from .config import DeepseekV4Config


@dataclass
class CompressorState:
    """Ring of raw fp32 compressor rows: ``kv`` and ``score`` (score + ape), both ``[ring, width]``."""

    kv: torch.Tensor
    score: torch.Tensor


@dataclass
class LayerCache:
    """Cache of one block; ``entries``/``state``/``index_*`` are ``None`` where the layer has no such part."""

    ratio: int
    swa: torch.Tensor
    entries: torch.Tensor | None = None
    state: CompressorState | None = None
    index_keys: torch.Tensor | None = None
    index_state: CompressorState | None = None


@dataclass
class SequenceCache:
    """All state of one sequence.  ``num_tokens`` = P (main layers); ``mtp_tokens`` = tokens seen by MTP."""

    layers: list[LayerCache]
    capacity: int
    num_tokens: int = 0
    mtp_tokens: int = 0
    n_mtp: int = 0


def _state(ring: int, width: int, device: torch.device | str | None) -> CompressorState:
    return CompressorState(torch.zeros(ring, width, device=device),
                           torch.full((ring, width), float("-inf"), device=device))


def new_cache(cfg: DeepseekV4Config, capacity: int, *, dtype: torch.dtype = torch.float32,
              device: torch.device | str | None = None, poison: float | None = None) -> SequenceCache:
    """Allocate a cache for up to ``capacity`` tokens.

    ``poison`` fills every tensor (compressor state included) with that value instead of the clean start state;
    a poisoned cache is only usable after ``restore``.  KV rows/entries use ``dtype``; compressor state is fp32.
    """
    layers = []
    for layer_id in range(cfg.n_blocks):
        m = cfg.ratio(layer_id)
        lc = LayerCache(ratio=m, swa=torch.zeros(cfg.window_size, cfg.head_dim, dtype=dtype, device=device))
        if m:
            lc.entries = torch.zeros(capacity // m, cfg.head_dim, dtype=dtype, device=device)
            width = 2 * cfg.head_dim if is_csa(m) else cfg.head_dim
            lc.state = _state(state_ring_rows(m), width, device)
        if is_csa(m):
            lc.index_keys = torch.zeros(capacity // m, cfg.index_head_dim, dtype=dtype, device=device)
            lc.index_state = _state(CSA_STATE_RING, 2 * cfg.index_head_dim, device)
        layers.append(lc)
    cache = SequenceCache(layers=layers, capacity=capacity, n_mtp=cfg.n_mtp_layers)
    if poison is not None:
        for t in cache_tensors(cache):
            t.fill_(poison)
    return cache


def cache_tensors(cache: SequenceCache) -> list[torch.Tensor]:
    """Every tensor of the cache (for poisoning, comparison, byte counts)."""
    out: list[torch.Tensor] = []
    for lc in cache.layers:
        out.append(lc.swa)
        for t in (lc.entries, lc.index_keys):
            if t is not None:
                out.append(t)
        for s in (lc.state, lc.index_state):
            if s is not None:
                out += [s.kv, s.score]
    return out


def reset(cache: SequenceCache) -> None:
    """Start a new sequence in this cache: P = 0, compressor state kv = 0 / score = -inf."""
    cache.num_tokens = 0
    cache.mtp_tokens = 0
    for lc in cache.layers:
        for s in (lc.state, lc.index_state):
            if s is not None:
                s.kv.zero_()
                s.score.fill_(float("-inf"))


# ----- section 4.2 boundary state ---------------------------------------------------------------------------------
@dataclass
class LayerSnapshot:
    """Boundary state of one layer at P: positions of the saved rows plus their contents (copies)."""

    swa_positions: list[int]
    swa_rows: torch.Tensor
    entries: torch.Tensor | None
    index_keys: torch.Tensor | None
    state_positions: list[int]
    state_rows: tuple[torch.Tensor, torch.Tensor] | None
    index_state_rows: tuple[torch.Tensor, torch.Tensor] | None


@dataclass
class CacheSnapshot:
    """The exact state needed to continue a sequence at ``num_tokens`` (main layers and MTP)."""

    num_tokens: int
    mtp_tokens: int
    layers: list[LayerSnapshot]


def _state_positions(ratio: int, p: int) -> list[int]:
    if ratio == 0:
        return []
    start = ratio * (p // ratio)
    if is_csa(ratio):
        start = max(0, start - CSA_OVERLAP_ROWS)
    return list(range(start, p))


def _rows(state: CompressorState | None, slots: list[int]) -> tuple[torch.Tensor, torch.Tensor] | None:
    if state is None:
        return None
    return state.kv[slots].clone(), state.score[slots].clone()


def snapshot(cache: SequenceCache, window: int) -> CacheSnapshot:
    """Copy the section 4.2 boundary state of ``cache`` at its current P (MTP layers at ``mtp_tokens``)."""
    n_main = len(cache.layers) - cache.n_mtp
    layers = []
    for k, lc in enumerate(cache.layers):
        p = cache.num_tokens if k < n_main else cache.mtp_tokens
        swa_pos = list(range(max(0, p - window + 1), p))
        st_pos = _state_positions(lc.ratio, p)
        ring = lc.state.kv.shape[0] if lc.state is not None else 1
        slots = [q % ring for q in st_pos]
        n_entries = p // lc.ratio if lc.ratio else 0
        layers.append(LayerSnapshot(
            swa_positions=swa_pos,
            swa_rows=lc.swa[[q % window for q in swa_pos]].clone(),
            entries=None if lc.entries is None else lc.entries[:n_entries].clone(),
            index_keys=None if lc.index_keys is None else lc.index_keys[:n_entries].clone(),
            state_positions=st_pos,
            state_rows=_rows(lc.state, slots),
            index_state_rows=_rows(lc.index_state, [q % CSA_STATE_RING for q in st_pos]),
        ))
    return CacheSnapshot(cache.num_tokens, cache.mtp_tokens, layers)


def restore(snap: CacheSnapshot, cache: SequenceCache, window: int) -> None:
    """Write ``snap`` into ``cache`` (same config and enough capacity); nothing else in ``cache`` is touched."""
    if len(snap.layers) != len(cache.layers):
        raise ValueError(f"snapshot has {len(snap.layers)} layers, cache has {len(cache.layers)}")
    for ls, lc in zip(snap.layers, cache.layers):
        lc.swa[[q % window for q in ls.swa_positions]] = ls.swa_rows
        if ls.entries is not None:
            lc.entries[: ls.entries.shape[0]] = ls.entries
        if ls.index_keys is not None:
            lc.index_keys[: ls.index_keys.shape[0]] = ls.index_keys
        for state, rows in ((lc.state, ls.state_rows), (lc.index_state, ls.index_state_rows)):
            if state is not None and rows is not None:
                slots = [q % state.kv.shape[0] for q in ls.state_positions]
                state.kv[slots] = rows[0]
                state.score[slots] = rows[1]
    cache.num_tokens = snap.num_tokens
    cache.mtp_tokens = snap.mtp_tokens
