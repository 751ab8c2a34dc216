"""Binding the KV arena: one byte buffer, and the per-layer tensor views the kernels address.

The layout (:class:`atom.kv.kv_layout.KvLayout`) decides every byte offset; this module only
turns offsets into views, so the runner has no geometry of its own:

- ``swa[layer]``: 2D ``[rows, head_dim]`` over every layer's SWA rows; row = ``page * row_stride + pos % B``;
- ``comp[layer]`` / ``index[layer]``: 2D row views of compressed rows / indexer keys; row =
  ``(page // k) * chunk_rows + (page % k) * entries_per_block + slot``;
- ``csa[layer]``: the fused CSA boundary state, four fp32 ``[swa_pages, 4, width]`` views;
- ``state[layer]`` / ``index_state[layer]`` (CSA layers): the live compressor rings, ``(kv, score)``
  fp32 ``[state_pages, 8, width]`` of the main and indexer compressors;
- ``hca[layer]`` (HCA layers): the online softmax accumulator, fp32 ``[state_pages, 3, head_dim]``
  (running max, running sum of exp, running weighted sum; see :mod:`atom.kernels.hca_state`).

The state views address pages of the arena's ``state`` owner (a request's ``state_slot`` is its
page): page ``p`` starts at byte ``p * state_page_bytes`` (state pages tile chunks exactly), each
part at its offset inside the page (:mod:`atom.kv.state_layout`). A view spans every
page of the buffer; only pages of chunks the state owner holds are ever addressed.

Rows are stored in the layout's row format: ``fp32`` / ``bf16`` views of values, or, for ``fp8_ds_mla``,
uint8 byte views (SWA and compressed rows in ``fp8_ds_mla``, indexer keys in the FP8 key format) that
the kernels encode and decode with the codecs in :attr:`KvViews.main_codec` / :attr:`KvViews.index_codec`.
Compressor state (the CSA boundary state, the rings, the HCA accumulator) is not KV: it stays fp32 in
every format. With ``poison`` every byte of the buffer starts as 0xFF (NaN as fp32, bf16 and e4m3),
so any read of memory that no step wrote shows in the outputs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from atom.kernels.fp8_ds_mla import Fp8DsMlaLayout
from atom.kernels.fp8_index_key import Fp8IndexKeyLayout
from atom.kv_group import CSA_OVERLAP_ROWS, is_csa
from atom.kv.kv_layout import KvLayout, RowRegion

__all__ = ["CsaViews", "KvViews", "bind_kv_arena", "row_codecs"]

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp8_ds_mla": torch.uint8}


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
    main_codec: Fp8DsMlaLayout | None = None  # None: swa / comp views hold values
    index_codec: Fp8IndexKeyLayout | None = None  # None: index views hold values

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


def _state(fp32: torch.Tensor, layout: KvLayout, layer: int) -> dict[str, torch.Tensor]:
    """One ``[state_pages, rows, width]`` view per state part of ``layer``."""
    stride = layout.state_page_bytes // 4
    return {name: torch.as_strided(fp32, (layout.max_state_pages, part.rows, part.width), (stride, part.width, 1),
                                   part.offset // 4)
            for name, part in layout.state_parts(layer).items()}


def row_codecs(spec) -> tuple[Fp8DsMlaLayout | None, Fp8IndexKeyLayout | None]:
    """The codecs of the main rows and of the indexer keys of ``spec`` (None for value rows)."""
    if spec.row_format != "fp8_ds_mla":
        return None, None
    main = Fp8DsMlaLayout(nope=spec.head_dim - spec.rope_head_dim, rope=spec.rope_head_dim, qblock=spec.fp8_block)
    index = Fp8IndexKeyLayout(dim=spec.index_head_dim)
    assert main.row_bytes == spec.main_row_bytes and index.row_bytes == spec.index_row_bytes
    return main, index


def bind_kv_arena(layout: KvLayout, *, poison: bool = False, device: str | torch.device = "cpu") -> KvViews:
    """Allocate the arena buffer (``layout.arena_bytes``); return every view."""
    spec = layout.spec
    if layout.reserved_state_slots:
        raise ValueError("the runner binds compressor state as arena pages; a layout with a reserved "
                         "state pool (reserved_state_slots > 0) is for capacity comparisons only")
    if spec.row_format not in _DTYPES:
        raise ValueError(f"this runner stores rows as {', '.join(_DTYPES)}; the layout uses {spec.row_format!r}")
    dtype = _DTYPES[spec.row_format]
    elem = torch.empty((), dtype=dtype).element_size()
    buffer = torch.empty(layout.arena_bytes, dtype=torch.uint8, device=device)
    buffer.fill_(0xFF if poison else 0)
    fp32 = buffer.view(torch.float32)
    flat = buffer.view(dtype)
    swa, comp, index, csa, state, index_state, hca = {}, {}, {}, {}, {}, {}, {}
    for layer, ratio in enumerate(spec.compress_ratios):
        swa[layer] = _rows(flat, layout.swa_rows(layer), elem)
        if ratio == 0:
            continue
        comp[layer] = _rows(flat, layout.compressed_rows(layer), elem)
        if is_csa(ratio):
            index[layer] = _rows(flat, layout.index_rows(layer), elem)
            csa[layer] = _csa(fp32, layout, layer)
            parts = _state(fp32, layout, layer)
            state[layer] = (parts["main_kv"], parts["main_score"])
            index_state[layer] = (parts["index_kv"], parts["index_score"])
        else:
            hca[layer] = _state(fp32, layout, layer)["hca_acc"]
    return KvViews(layout, buffer, swa, comp, index, csa, state, index_state, hca, *row_codecs(spec))
