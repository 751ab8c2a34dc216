"""Binding the KV arena: one byte buffer, and the per-layer tensor views the kernels address.

The layout (:class:`atom.model_engine.kv_layout.KvLayout`) decides every byte offset; this module only
turns offsets into views, so the runner has no geometry of its own:

- ``swa[layer]``: 2D ``[rows, head_dim]`` over every layer's SWA rows; row = ``page * row_stride + pos % B``;
- ``comp[layer]`` / ``index[layer]``: 2D row views of compressed rows / indexer keys; row =
  ``(page // k) * chunk_rows + (page % k) * entries_per_block + slot``;
- ``csa[layer]``: the fused CSA boundary state, four fp32 ``[swa_pages, 4, width]`` views;
- ``state[layer]`` / ``index_state[layer]`` (CSA layers): the live compressor rings (outside the arena,
  budgeted by the layout): ``(kv, score)`` fp32 ``[slots, 8, width]`` of the main and indexer compressors;
- ``hca[layer]`` (HCA layers): the online softmax accumulator, fp32 ``[slots, 3, head_dim]``
  (running max, running sum of exp, running weighted sum; see :mod:`atom.kernels.hca_state`).

Rows are stored in the layout's row format; this engine runs the ``fp32`` format (the CPU reference
path) and ``bf16``. With ``poison`` the buffer and the state pool start as NaN, so any read of memory
that no step wrote shows in the outputs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from atom.kv_group import CSA_OVERLAP_ROWS, CSA_STATE_RING, HCA_STATE_ROWS, is_csa
from atom.model_engine.kv_layout import KvLayout, RowRegion

__all__ = ["CsaViews", "KvViews", "bind_kv_arena"]

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


@dataclass
class CsaViews:
    main_kv: torch.Tensor
    main_score: torch.Tensor
    index_kv: torch.Tensor
    index_score: torch.Tensor


@dataclass
class KvViews:
    """All views of one arena buffer (keyed by layer id)."""

    layout: KvLayout
    buffer: torch.Tensor
    swa: dict[int, torch.Tensor]
    comp: dict[int, torch.Tensor]
    index: dict[int, torch.Tensor]
    csa: dict[int, CsaViews]
    state: dict[int, tuple[torch.Tensor, torch.Tensor]]
    index_state: dict[int, tuple[torch.Tensor, torch.Tensor]]
    hca: dict[int, torch.Tensor]

    def region(self, layer: int, kind: str) -> RowRegion:
        lay = self.layout
        return {"swa": lay.swa_rows, "compressed": lay.compressed_rows, "index": lay.index_rows}[kind](layer)


def _rows(flat: torch.Tensor, region: RowRegion, elem: int) -> torch.Tensor:
    assert region.offset % elem == 0 and region.row_bytes % elem == 0
    width = region.row_bytes // elem
    return torch.as_strided(flat, (region.num_rows, width), (width, 1), region.offset // elem)


def _csa(fp32: torch.Tensor, layout: KvLayout, layer: int) -> CsaViews:
    st = layout.csa_state(layer)
    views = {}
    for name, (off, width) in st.parts.items():
        views[name] = torch.as_strided(fp32, (layout.max_swa_pages, CSA_OVERLAP_ROWS, width), (st.page_stride // 4, width, 1),
                                       (st.offset + off) // 4)
    return CsaViews(**views)


def _state_pool(slots: int, ring: int, width: int, poison: bool, device) -> tuple[torch.Tensor, torch.Tensor]:
    fill = float("nan") if poison else 0.0
    return (torch.full((slots, ring, width), fill, device=device),
            torch.full((slots, ring, width), float("nan") if poison else float("-inf"), device=device))


def bind_kv_arena(layout: KvLayout, *, poison: bool = False, device: str | torch.device = "cpu") -> KvViews:
    """Allocate the arena buffer (``layout.arena_bytes``) and the state pool; return every view."""
    spec = layout.spec
    if spec.row_format not in _DTYPES:
        raise ValueError(f"this runner stores rows as {', '.join(_DTYPES)}; the layout uses {spec.row_format!r}")
    dtype = _DTYPES[spec.row_format]
    elem = torch.finfo(dtype).bits // 8
    buffer = torch.empty(layout.arena_bytes, dtype=torch.uint8, device=device)
    fp32 = buffer.view(torch.float32)
    fp32.fill_(float("nan") if poison else 0.0)
    flat = buffer.view(dtype)
    swa, comp, index, csa, state, index_state, hca = {}, {}, {}, {}, {}, {}, {}
    slots = layout.max_live_requests
    for layer, ratio in enumerate(spec.compress_ratios):
        swa[layer] = _rows(flat, layout.swa_rows(layer), elem)
        if ratio == 0:
            continue
        comp[layer] = _rows(flat, layout.compressed_rows(layer), elem)
        if is_csa(ratio):
            index[layer] = _rows(flat, layout.index_rows(layer), elem)
            csa[layer] = _csa(fp32, layout, layer)
            state[layer] = _state_pool(slots, CSA_STATE_RING, 2 * spec.head_dim, poison, device)
            index_state[layer] = _state_pool(slots, CSA_STATE_RING, 2 * spec.index_head_dim, poison, device)
        else:
            hca[layer] = torch.full((slots, HCA_STATE_ROWS, spec.head_dim), float("nan") if poison else 0.0,
                                    device=device)
    return KvViews(layout, buffer, swa, comp, index, csa, state, index_state, hca)
