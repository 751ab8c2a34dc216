"""The serving model's attention: DeepSeek-V4 attention on the paged KV arena.

:class:`ArenaAttention` declares the reference's attention parameters (:class:`AttentionWeights`: the same
names, the same token-local projections, its own compressor and indexer built from the shared classes, whose
row rules it calls) and keeps every row in the arena views bound to it (:meth:`ArenaAttention.bind_arena`).

Per layer and step, in this order (each step of it through a kernel of :mod:`atom.kernels`):

1. token-local projections (``AttentionWeights.project``: q, the K=V row, compressor and indexer rows);
2. ``swa_write``: every token's K=V row into its SWA page (``row = page * row_stride + pos % B``), so the
   window of every query in the step is in the arena before anyone reads it. On a GPU backend
   ``rope_kv_write`` takes ``wkv``'s output, applies ``kv_norm`` and RoPE and the release's round trip
   (``quant_sim``) and writes (or encodes) it in the same launch (:attr:`ArenaAttention.fuse_kv_write`);
3. compressor state. CSA: clear the ring of a newly admitted request, ``csa_boundary_restore`` the
   overlap rows from the SWA page of a prefix hit's last block, pool every entry the chunk completes
   (rows from the ring for positions before the chunk, from the fresh projections inside it), then
   ``csa_state_write``: the ring update and the capture of the overlap rows of blocks whose last 4
   positions ran (into each block's own SWA page, -1 = skip), one launch. HCA: ``hca_state_update``
   advances the request's online softmax accumulator in position order and yields the pooled row of
   every block the chunk completes (see :mod:`atom.kernels.hca_state`);
4. ``compressed_write`` the finished entries (and indexer keys) into compress-owned pages;
5. CSA: ``index_score`` of every query over its candidate keys in the arena, ``index_topk`` (the
   reference indexer's top-k rule) per query; index lists from
   ``build_window_index`` / ``build_comp_index``; ``sparse_attention`` with the per-head sink;
6. inverse RoPE and the grouped output projection (``AttentionWeights.project_out``).

Every CSA entry the step completes (all sequences) is pooled at once: the shared compressor's
``entry_sources`` decides which rows an entry pools ([previous block's "b" half; this block's "a" half]),
``entry_pool`` reads them from the chunk's fresh rows or the request's ring and pools them, then
``finish_entries``, so CSA entries equal the reference model's up to the rounding of batched ops. Top-k
scores every query of the step against its visible keys in one batched op (``index_score``, then
``index_topk``: the reference's ``score`` / ``select`` rule of ``Indexer.select_scores``, ties to the lower
index). HCA
entries differ from the reference's batch softmax by rounding only (within 1e-6 relative in fp32).
Within the engine everything is bit-identical however a sequence is split into steps or resumed from a
prefix hit. No step reads a device value back: entry lists, index widths and flags come from the batch
(``StepInputs``).

Speculative decoding (``step.committed`` set: some sequences end in drafts): every row of the step is
written and attended as usual (the drafts' SWA rows and the entries they complete lie past the
sequence's computed length: nothing reads them before a later step overwrites them), but the
compressor state (CSA rings, CSA boundary capture, HCA accumulators) advances over the committed rows
only; HCA entries completed inside the drafts are pooled from a scratch copy of the accumulators. The
layer keeps the step's compressor projections until :meth:`ArenaAttention.commit` advances
the state over the drafts the verifier accepted, so rejected drafts leave no trace in the state.

Row formats: with value views (fp32 / bf16) rows are written in the view's dtype. With ``fp8_ds_mla``
byte views (``views.main_codec`` / ``views.index_codec`` set) the writers get the model's fp32/bf16
rows and encode them, and attention and the indexer score decode rows inside the kernel. With the
model's ``quant_sim`` on, the rows it produces already went through the same FP8 round-trip (NoPE
per ``fp8_block``, RoPE in bf16; indexer keys FP4 on a power-of-two grid), so encoding loses nothing
and the engine computes what the reference model computes.
"""

from __future__ import annotations

import torch

from atom.kernels.backend import KernelSet
from atom.model_ops.kv_views import KvViews
from atom.model_ops.step_inputs import EntryList, PageTables, RowSubset, StepInputs
from atom.models.deepseek_v4.attention import AttentionWeights, Projections
from atom.models.deepseek_v4.compressor import Compressor
from atom.models.deepseek_v4.config import DeepseekV4Config
from atom.models.deepseek_v4.device_constants import on_device
from atom.models.deepseek_v4.layers import map_rows

__all__ = ["ArenaAttention", "bucket"]


class ArenaAttention(AttentionWeights):
    """One layer's attention over the arena. Besides its parameters it holds the arena views and kernel
    ops bound to it and, from a forward with drafts to its :meth:`commit`, that step's compressor
    projections; no other state."""

    def __init__(self, cfg: DeepseekV4Config, layer_id: int, *, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None) -> None:
        super().__init__(cfg, layer_id, dtype=dtype, device=device)
        self.views: KvViews | None = None
        self.k: KernelSet | None = None
        self._pending: Projections | None = None  # a step with drafts: its projections until commit()
        self.fuse_kv_write = False  # set by bind_arena: rope_kv_write rotates, rounds and writes the K=V rows

    def bind_arena(self, views: KvViews, kernels: KernelSet) -> None:
        """Keep this layer's rows in ``views`` (its regions of the layout) and run ``kernels``' ops."""
        self.views, self.k = views, kernels
        lay = views.layout
        self.block_size = lay.spec.block_size
        self.swa_region = lay.swa_rows(self.layer_id)
        self.comp_region = lay.compressed_rows(self.layer_id) if self.ratio else None
        self.index_region = lay.index_rows(self.layer_id) if self.indexer is not None else None
        self._pending = None
        # a GPU backend rotates, rounds and writes the new K=V rows in one launch; the torch backend keeps the
        # reference's ops one by one (the CPU engine is compared with the reference model value for value)
        self.fuse_kv_write = kernels.sources.get("rope_kv_write", "torch") != "torch"
        self._bind_compressors(kernels.backend != "torch")
        # a GPU backend merges GEMMs and writes wo_a's product in place; the torch backend keeps the reference's
        self.bind_fused_gemms(kernels.backend != "torch")

    def finish_kv(self, kv: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The reference's K=V rows exactly as cached; with :attr:`fuse_kv_write` ``wkv``'s output as it is (a
        strided view when merged): ``rope_kv_write`` applies ``kv_norm``, RoPE and the release's round trip on
        the way into the arena."""
        if self.fuse_kv_write:
            return kv
        return super().finish_kv(kv, positions)

    def index_weights(self, x: torch.Tensor) -> torch.Tensor:
        """The indexer's head weights before their scale: ``index_score`` multiplies by it (``w_scale``, the
        model's multiply in the kernel), so no separate launch."""
        return self.indexer.weights_proj(x)

    # ---- the step -----------------------------------------------------------------------------
    def forward(self, x: torch.Tensor, step: StepInputs, tables: PageTables) -> torch.Tensor:
        """The attention output ``[T, dim]`` of the step's rows ``x [T, dim]`` (steps 1-6 of the module
        docstring); writes their rows into the arena."""
        if self.views is None:
            raise RuntimeError(f"attention of layer {self.layer_id} has no arena: call bind_arena first")
        rw = self.cfg.batch_invariant
        p: Projections = map_rows(self.project, rw, x, step.positions)
        pos32 = step.derive(("pos32",), lambda: step.positions.to(torch.int32))
        main_codec = self.views.main_codec
        rows = self.views.swa[self.layer_id]
        if self.fuse_kv_write:
            self.k.rope_kv_write(p.kv, rows, tables.swa, step.token_slot, pos32, on_device(self.freqs, x.device),
                                 block_size=self.block_size, row_stride=self.swa_region.page_rows,
                                 fp8_block=self.cfg.fp8_block if self.cfg.quant_sim else 0, codec=main_codec,
                                 norm_weight=self.kv_norm.weight, norm_eps=float(self.kv_norm.eps))
        else:
            self.k.swa_write(_values(p.kv, rows, main_codec), rows, tables.swa, step.token_slot, pos32,
                             block_size=self.block_size, row_stride=self.swa_region.page_rows, codec=main_codec)
        comp_idx = None
        self._pending = p if self.ratio and step.committed is not None else None
        if self.ratio and self.indexer is None:
            self._compress_hca(p.comp, step, tables)
            comp_idx = self._comp_index(p, step, tables, pos32)
        elif self.ratio:
            self._prepare_state(step)
            self._compress(self.compressor, p.comp, step, tables, self.views.state[self.layer_id],
                           self.views.comp[self.layer_id], self.comp_region, "main", main_codec)
            if self.indexer is not None:
                self._compress(self.indexer.compressor, p.index_comp, step, tables,
                               self.views.index_state[self.layer_id], self.views.index[self.layer_id],
                               self.index_region, "index", self.views.index_codec)
            comp_idx = self._comp_index(p, step, tables, pos32)
        geo = dict(window=self.cfg.window_size, block_size=self.block_size, row_stride=self.swa_region.page_rows)
        window_idx = step.derive(("window_index", *geo.values()), lambda: self.k.build_window_index(
            tables.swa, step.token_slot, pos32, **geo))
        o = self.k.sparse_attention(_values(p.q, rows, main_codec), rows, window_idx,
                                    None if comp_idx is None else self.views.comp[self.layer_id], comp_idx,
                                    self.attn_sink.float(), scale=float(self.scale), codec=main_codec)
        return map_rows(self.project_out, rw, o.to(x.dtype), step.positions)

    # ---- compressor state ---------------------------------------------------------------------
    def _bind_compressors(self, fused: bool) -> None:
        """The state kernels (``csa_state_write``, ``hca_state_update``, ``entry_pool``) add each compressor's
        ``ape[pos % m]`` to the projected scores, so the projections leave it out (``Compressor.kernels_add_ape``):
        no remainder, gather and add per compressor and step. Each kernel applies the one fp32 add the projection
        did, so rings, captures and entries keep their bits.
        ``fused`` (a GPU backend): each compressor's ``wkv`` and ``wgate`` as one GEMM
        (``Compressor.bind_fused_gemm``)."""
        for comp in (self.compressor, None if self.indexer is None else self.indexer.compressor):
            if comp is not None:
                comp.kernels_add_ape = True
                comp.bind_fused_gemm(fused)

    def _prepare_state(self, step: StepInputs) -> None:
        """Clear the CSA rings of newly admitted requests, then restore CSA boundary rows of prefix hits."""
        pools = [self.views.state[self.layer_id], self.views.index_state[self.layer_id]]
        if step.any_reset:
            slot, reset = step.slots.long(), step.reset[:, None, None]
            for kv, score in pools:
                kv[slot] = kv[slot].masked_fill(reset, 0.0)
                score[slot] = score[slot].masked_fill(reset, float("-inf"))
        if not step.any_restore:
            return
        csa = self.views.csa[self.layer_id]
        for (kv, score), (src_kv, src_score) in zip(pools, ((csa.main_kv, csa.main_score),
                                                            (csa.index_kv, csa.index_score))):
            self.k.csa_boundary_restore(src_kv, src_score, kv, score, step.restore_src, step.slots, step.pos_start)

    def _compress_hca(self, rows: tuple[torch.Tensor, torch.Tensor], step: StepInputs, tables: PageTables) -> None:
        """HCA: advance each request's online accumulator over its chunk (``hca_state_update``), then
        finish and write every entry the chunk completes at once (its pooled row sits at the block's last
        token). The accumulator needs no reset: a block's first position starts it empty, and a request
        always starts at a block boundary.

        ``hca_state_update`` writes only the rows of tokens that complete a block, and the step's padding entries
        read row 0: the pooled rows are one zeroed buffer per step and width, shared by the HCA layers (each
        rewrites the same block-completing rows before reading them), so a padding entry finishes a defined row
        (zeros or this layer's) rather than uninitialized memory, at one fill per step."""
        comp = self.compressor
        kv, score = rows  # row views (of one GEMM's output when merged): the kernels take a row stride
        pooled = step.derive(("hca_pooled", tuple(kv.shape)), lambda: kv.new_zeros(kv.shape))
        acc, slots = self.views.hca[self.layer_id], step.slots
        if step.committed is not None:  # pool the drafts' entries from a copy; the state takes committed rows
            acc, slots = acc[slots.long()].clone(), torch.arange(len(step.lengths), dtype=torch.int32,
                                                                 device=slots.device)
        self.k.hca_state_update(kv, score, comp.ape, acc, slots,
                                step.cu_seqlens, step.pos_start, pooled, max_len=step.max_len)
        if step.committed is not None:
            self._advance_hca(rows, step.committed, step)
        ent = step.entries[comp.ratio]

        def last_tokens() -> torch.Tensor:
            seq = ent.seq.clamp(min=0)
            tok = step.cu_seqlens.long()[seq] + (ent.ids + 1) * comp.ratio - 1 - step.pos_start.long()[seq]
            return torch.where(ent.seq >= 0, tok, 0)  # padding entries read row 0 and are not written

        tok = step.derive(("hca_last_tokens", comp.ratio), last_tokens)
        self._write_entries(comp.finish_entries(pooled[tok], ent.ids, _entry_positions(step, comp.ratio)), ent, step,
                            tables, self.views.comp[self.layer_id], self.comp_region, self.views.main_codec)

    def _advance_hca(self, rows: tuple[torch.Tensor, torch.Tensor], sub: RowSubset, step: StepInputs) -> None:
        """Advance the HCA accumulators over the rows ``sub`` selects (their pooled rows are not used)."""
        if sub.max_len == 0:
            return
        kv, score = (r[sub.rows].contiguous() for r in rows)
        self.k.hca_state_update(kv, score, self.compressor.ape, self.views.hca[self.layer_id],
                                step.slots, sub.cu_seqlens, sub.pos_start, torch.empty_like(kv), max_len=sub.max_len)

    def _advance_csa(self, comp: Compressor, rows: tuple[torch.Tensor, torch.Tensor], sub: RowSubset | None,
                     step: StepInputs, tables: PageTables, which: str) -> None:
        """Write the rows ``sub`` selects (all rows of the step: None) into the CSA ring, and capture the
        block-final overlap rows among them into their SWA pages."""
        kv, score = rows
        cu, start, longest = step.cu_seqlens, step.pos_start, step.max_len
        if sub is not None:
            if sub.max_len == 0:
                return
            kv, score, cu, start, longest = kv[sub.rows], score[sub.rows], sub.cu_seqlens, sub.pos_start, sub.max_len
        state = self.views.state[self.layer_id] if which == "main" else self.views.index_state[self.layer_id]
        csa = self.views.csa[self.layer_id]
        dst = (csa.main_kv, csa.main_score) if which == "main" else (csa.index_kv, csa.index_score)
        window = lambda: _table_window(tables.swa, step.rows, start, longest, self.block_size)  # noqa: E731
        pages, at = window() if sub is not None else step.derive(("capture_window", self.block_size), window)
        # compressor_state_update and csa_boundary_capture of the same rows, one launch
        self.k.csa_state_write(kv, score, comp.ape, state[0], state[1], step.slots, dst[0], dst[1], pages, cu, start,
                               at, block_size=self.block_size)

    def commit(self, accepted: RowSubset, step: StepInputs, tables: PageTables) -> None:
        """After verification: advance the compressor state over the accepted drafts (``accepted`` selects
        their rows of the step just run), then drop the step's projections."""
        p, self._pending = self._pending, None
        if p is None:
            return
        if self.indexer is None:
            self._advance_hca(p.comp, accepted, step)
            return
        self._advance_csa(self.compressor, p.comp, accepted, step, tables, "main")
        self._advance_csa(self.indexer.compressor, p.index_comp, accepted, step, tables, "index")

    def _write_entries(self, entries: torch.Tensor, ent: EntryList, step: StepInputs, tables: PageTables,
                       out_rows: torch.Tensor, region, codec) -> None:
        row, ids = step.derive(("entry_table_rows", id(ent)), lambda: (
            torch.where(ent.seq >= 0, step.rows[ent.seq.clamp(min=0)], -1), ent.ids.to(torch.int32)))
        self.k.compressed_write(_values(entries, out_rows, codec), out_rows, tables.comp, row,
                                ids, entries_per_block=region.used_rows,
                                pages_per_chunk=region.pages_per_chunk, chunk_rows=region.chunk_rows, codec=codec)

    def _compress(self, comp: Compressor, rows: tuple[torch.Tensor, torch.Tensor], step: StepInputs,
                  tables: PageTables, state: tuple[torch.Tensor, torch.Tensor], out_rows: torch.Tensor,
                  region, which: str, codec) -> None:
        kv, score = rows
        ent = step.entries[comp.ratio]
        entries = self._finished_entries(comp, kv, score, step, ent, state)  # reads the ring before the update
        self._advance_csa(comp, (kv, score), step.committed, step, tables, which)
        self._write_entries(entries, ent, step, tables, out_rows, region, codec)

    def _finished_entries(self, comp: Compressor, kv: torch.Tensor, score: torch.Tensor, step: StepInputs,
                          ent: EntryList, state: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """Every entry of ``ent`` at once, ``[E, c]``: ``Compressor.entry_sources`` says which rows each pools;
        a row at a position inside its sequence's chunk comes from the fresh projections, an earlier one from
        the slot's ring (``entry_pool``); padding entries give rows that ``compressed_write`` skips. The row
        indices depend only on the step and the compressor's geometry: computed once per step."""
        fresh_row, ring_row, col = step.derive(("entry_rows", comp.ratio, comp.ring_size, comp.head_dim),
                                               lambda: _entry_rows(comp, step, ent))
        pos32 = step.derive(("pos32",), lambda: step.positions.to(torch.int32))
        pooled = self.k.entry_pool(kv, score, comp.ape, pos32, state[0], state[1], fresh_row, ring_row, col,
                                   width=comp.head_dim)
        return comp.finish_entries(pooled, ent.ids, _entry_positions(step, comp.ratio))

    # ---- index lists --------------------------------------------------------------------------
    def _comp_index(self, p: Projections, step: StepInputs, tables: PageTables, pos32: torch.Tensor) -> torch.Tensor:
        reg = self.comp_region
        geo = dict(ratio=self.ratio, entries_per_block=reg.used_rows, pages_per_chunk=reg.pages_per_chunk,
                   chunk_rows=reg.chunk_rows)
        if self.indexer is None:
            width = step.index_width(self.ratio)
            return step.derive(("comp_index", width, *geo.values()), lambda: self.k.build_comp_index(
                tables.comp, step.token_slot, pos32, None, width=width, **geo))
        picks = self._topk(p, step, tables, pos32)
        return self.k.build_comp_index(tables.comp, step.token_slot, pos32, picks, width=picks.shape[1], **geo)

    def _topk(self, p: Projections, step: StepInputs, tables: PageTables, pos32: torch.Tensor) -> torch.Tensor:
        """int32 ``[T, index_topk]`` logical entries each query attends (ascending, -1 padded), for every
        query of the step at once over its keys gathered from the arena."""
        reg, ratio = self.index_region, self.ratio  # a CSA layer's: only CSA layers have an indexer
        geo = dict(width=step.index_width(ratio), ratio=ratio, entries_per_block=reg.used_rows,
                   pages_per_chunk=reg.pages_per_chunk, chunk_rows=reg.chunk_rows)
        key_rows = step.derive(("comp_index", *geo.values()), lambda: self.k.build_comp_index(
            tables.comp, step.token_slot, pos32, None, **geo))
        scores = self.k.index_score(p.index_q.contiguous(), p.index_w.contiguous(), self.views.index[self.layer_id],
                                    key_rows, codec=self.views.index_codec, w_scale=float(self.indexer.weight_scale))
        visible = step.derive(("visible_entries", ratio), lambda: (step.positions + 1) // ratio)
        return self.k.index_topk(scores, visible, self.cfg.index_topk)  # Indexer.select_scores' rule, one launch


def _entry_positions(step: StepInputs, ratio: int) -> torch.Tensor:
    """The RoPE position ``i * ratio`` of every entry ``i`` the step completes at ``ratio``: once per step, shared
    by every layer (and the indexer) of that ratio."""
    return step.derive(("entry_positions", ratio), lambda: step.entries[ratio].ids * ratio)


def _entry_rows(comp: Compressor, step: StepInputs, ent: EntryList) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """int32 ``(fresh_row [E, R], ring_row [E, R], col [R])`` of ``entry_pool`` for the entries ``ent``."""
    seq = ent.seq.clamp(min=0)
    start = step.pos_start.long()[seq][:, None]
    first = step.cu_seqlens.long()[seq][:, None]
    slot = step.slots.long()[seq][:, None]
    pos, col, pad = comp.entry_sources(ent.ids)
    live = (ent.seq >= 0)[:, None]  # padding entries read padding rows only (their indices may be anything)
    fresh = (pos >= start) & ~pad & live
    fresh_row = torch.where(fresh, first + pos - start, -1).to(torch.int32)
    ring_row = torch.where(fresh | pad | ~live, -1, slot * comp.ring_size + pos % comp.ring_size).to(torch.int32)
    return fresh_row, ring_row, col


def _table_window(table: torch.Tensor, rows: torch.Tensor, start: torch.Tensor, longest: int,
                  block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The columns of ``table`` (rows ``rows``) that chunks of up to ``longest`` tokens starting at ``start``
    can touch, as int32 ``[S, W]`` (-1 past the table), with the starts moved into the first column's block
    (``start % block_size``). ``W`` follows ``longest``, never the table's width (``max_model_len``); a
    shift by whole blocks keeps ``pos % block_size`` and ``pos % ratio`` (``block_size`` is a multiple of
    every ratio), so a kernel that reads ``table[s, pos // block_size]`` sees the same pages."""
    width = (longest + block_size - 2) // block_size + 1
    first = start.long() // block_size
    cols = first[:, None] + torch.arange(width, device=table.device)[None, :]
    inside = cols < table.shape[1]
    pages = table[rows.long()[:, None], cols.clamp(max=table.shape[1] - 1)]
    return torch.where(inside, pages, -1), start - (first * block_size).to(start.dtype)


def _values(x: torch.Tensor, rows: torch.Tensor, codec) -> torch.Tensor:
    """``x`` as the values a writer / reader of ``rows`` takes: the view's dtype for value rows, the
    model's own fp32/bf16 for byte rows (the kernel encodes them)."""
    return (x if codec is not None else x.to(rows.dtype)).contiguous()
