"""Where a request's live compressor state sits inside a state page of the arena.

Kept apart from :mod:`atom.kv.kv_layout` because it is a layout of its own: a chunk lent to
the ``state`` owner holds ``s`` whole request-state pages, and a state page holds, for every
compressed layer, the fp32 state that layer's compressor carries between steps::

    state page (one admitted request)
    +-------------------------------------------------------------------------------------------+
    | CSA layer: main kv [8, 2c] | main score [8, 2c] | index kv [8, 2ci] | index score [8, 2ci] |
    | HCA layer: accumulator [3, c] (running max, running sum of exp, running weighted sum)      |
    | ... every compressed layer in layer order ...                                  | pad       |
    +-------------------------------------------------------------------------------------------+

State pages tile chunks exactly (``chunk_bytes = s * state_page_bytes``), so state page ``p`` starts
at byte ``p * state_page_bytes`` of the buffer and one uniformly strided view per part addresses
every page: ``view[p] = bytes [p * state_page_bytes + part offset, ...)``. ``s`` is therefore the
largest page count that divides the chunk into fp32-aligned pages no smaller than a request's state
(a chunk of 6.7 requests' state on V4-Flash fp8 holds 6; the rest of the chunk is padding).
"""

from __future__ import annotations

from dataclasses import dataclass

from atom.config import Dsv4KvSpec
from atom.kv_group import CSA_STATE_RING, HCA_STATE_ROWS, is_csa

__all__ = ["StatePart", "state_parts", "state_pages_per_chunk"]

_FP32 = 4


@dataclass(frozen=True)
class StatePart:
    """One fp32 ``[rows, width]`` tensor of one layer's state, at ``offset`` bytes into a state page."""

    layer: int
    name: str  # "main_kv" | "main_score" | "index_kv" | "index_score" | "hca_acc"
    offset: int
    rows: int
    width: int

    @property
    def nbytes(self) -> int:
        return self.rows * self.width * _FP32


def state_parts(spec: Dsv4KvSpec) -> tuple[StatePart, ...]:
    """Every part of a request's state page, in layer order, packed back to back (fp32-aligned)."""
    parts, off = [], 0
    for layer in spec.compressed_layers:
        if is_csa(spec.compress_ratios[layer]):
            shapes = (("main_kv", CSA_STATE_RING, 2 * spec.head_dim), ("main_score", CSA_STATE_RING, 2 * spec.head_dim),
                      ("index_kv", CSA_STATE_RING, 2 * spec.index_head_dim),
                      ("index_score", CSA_STATE_RING, 2 * spec.index_head_dim))
        else:
            shapes = (("hca_acc", HCA_STATE_ROWS, spec.head_dim),)
        for name, rows, width in shapes:
            part = StatePart(layer, name, off, rows, width)
            parts.append(part)
            off += part.nbytes
    assert off == spec.request_state_bytes, f"state parts {off} B != request_state_bytes {spec.request_state_bytes}"
    return tuple(parts)


def state_pages_per_chunk(chunk_bytes: int, request_state_bytes: int) -> int:
    """Largest ``s`` with ``chunk_bytes / s`` a whole number of fp32 words and at least
    ``request_state_bytes``; 0 when the spec has no compressor state or one request's state exceeds a
    chunk (the caller reports that)."""
    if request_state_bytes == 0:
        return 0
    for s in range(chunk_bytes // request_state_bytes, 0, -1):
        if chunk_bytes % (_FP32 * s) == 0:
            return s
    return 0
