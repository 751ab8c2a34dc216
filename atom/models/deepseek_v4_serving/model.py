"""DeepSeek-V4 for serving: the model the engine runs, one step of many sequences over the paged KV arena.

It declares the reference model's parameters (:class:`ModelWeights`: the same names, shapes and formats,
so ``load_checkpoint(..., model_class=DeepseekV4ForServing)`` and the sharded loader read the same
checkpoint) and has its own modules for everything that runs per step: :class:`ServingBlock` (mHC and
norms around the arena attention and the MoE). The reference model (:mod:`atom.models.deepseek_v4`) stays
the CPU oracle the engine is tested against; this model never holds one.

Entry points (all take the step's tensors, :class:`StepInputs`, and the page tables; none reads a device
value back on the grouped MoE path):

* :meth:`bind_arena`: the arena views and kernel ops every attention layer writes and reads through;
* :meth:`forward`: logits of the rows that sample (of every row with ``all_rows``) and the final stream;
* :meth:`pad_experts`: a padding step of data-parallel attention (the MoE exchanges only);
* :meth:`commit`: after verification, advance the compressor state over the accepted drafts;
* :meth:`mtp_forward`: the MTP block over given rows (speculative drafting);
* :attr:`supports_decode_graphs`: whether a decode step can be recorded in a CUDA graph.
"""

from __future__ import annotations

import torch

from atom.kernels.backend import KernelSet
from atom.kernels.key_blocks import fixed_key_blocks
from atom.kernels.step_memo import step_memo
from atom.model_ops.kv_views import KvViews
from atom.model_ops.step_inputs import PageTables, RowSubset, StepInputs
from atom.models.deepseek_v4.fused_ops import fused_small_ops_for
from atom.models.deepseek_v4.layers import map_rows
from atom.models.deepseek_v4.model import ModelWeights
from atom.models.deepseek_v4.rope import shared_rope_tables

from .block import ServingBlock, ServingMTPBlock

__all__ = ["DeepseekV4ForServing"]


class DeepseekV4ForServing(ModelWeights):
    """DeepSeek-V4 over the paged arena (module docstring); build it with ``load_checkpoint(...,
    model_class=DeepseekV4ForServing)`` or load a state dict of the reference's names."""

    block_class = ServingBlock
    mtp_class = ServingMTPBlock

    @property
    def device(self) -> torch.device:
        return self.embed.weight.device

    @property
    def host_synced_layers(self) -> list[int]:
        """Layers whose forward reads a device value back: their routed experts run one GEMM per expert
        (quantized experts, or an expert-parallel rank)."""
        return [i for i, block in enumerate(self.layers) if not block.ffn.host_free]

    @property
    def supports_decode_graphs(self) -> bool:
        """Whether a decode step can be captured in a CUDA graph: on a CUDA/ROCm device, and no layer reads
        a device value back (:attr:`host_synced_layers` empty)."""
        return self.device.type == "cuda" and not self.host_synced_layers

    def bind_arena(self, views: KvViews, kernels: KernelSet, *, host_free_experts: bool = False) -> None:
        """Run every layer (the MTP block included) on the arena ``views`` with ``kernels``' ops, and every
        quantized Linear's GEMM and every MoE's routed experts with ``kernels``' implementations; the blocks' small
        token-local ops with its fused kernels on a GPU backend, with the reference's torch arithmetic on the torch
        backend (``ServingBlock.bind_small_ops``, :func:`fused_small_ops_for`); the
        weights the forward computes with in fp32 are cast once here (:meth:`cast_fp32_weights`).
        ``host_free_experts``: routed experts the torch backend cannot group (quantized, or a partition)
        run ``fused_moe``'s reference there, which reads nothing back (``ServingMoE.bind_kernels``)."""
        self.cast_fp32_weights()
        self.share_rope_frequencies()
        self.bind_kernels(kernels)
        for block in list(self.layers) + list(self.mtp):
            block.attn.bind_arena(views, kernels)
            block.ffn.bind_kernels(kernels, host_free=host_free_experts)
            block.bind_small_ops(fused_small_ops_for(kernels))  # after the GEMMs: its norms read their W8A8 binding

    def share_rope_frequencies(self) -> None:
        """Give every module's RoPE ``freqs`` of equal values one tensor object. The step's rotation tables are
        cached per ``(positions, freqs)`` object pair (:func:`shared_rope_tables`); each layer builds its own
        ``freqs``, so without this every layer, its compressor and indexer computed the tables again (84 table
        builds per thin-Flash decode step; with it one per positions tensor and frequency set: V4 has two sets,
        the uncompressed layers' and the compressed ones'). Same values, so the same rotations bit for bit."""
        kept: list[torch.Tensor] = []
        for module in self.modules():
            freqs = getattr(module, "freqs", None)
            if not isinstance(freqs, torch.Tensor):
                continue
            same = next((k for k in kept if k.dtype == freqs.dtype and k.device == freqs.device
                         and k.shape == freqs.shape and torch.equal(k, freqs)), None)
            if same is None:
                kept.append(freqs)
            else:
                module.freqs = same

    def logits(self, collapsed: torch.Tensor) -> torch.Tensor:
        """fp32 logits of ``[T, dim]`` rows. On a GPU with a bf16 / fp16 head: one GEMM in the head's dtype
        with fp32 accumulation and fp32 output (no fp32 copy of the head per step; the products of
        bf16 values are exact in fp32, only the accumulation order differs from the reference). Elsewhere
        (the CPU, fp32 weights) the reference's fp32 GEMM, so the engine's logits stay comparable
        with the reference model's exactly."""
        w = self.head.weight
        if w.device.type != "cuda" or w.dtype not in (torch.bfloat16, torch.float16):
            return super().logits(collapsed)
        return self.comm.all_gather(torch.mm(collapsed.to(w.dtype), w.t(), out_dtype=torch.float32), dim=-1)

    def forward(self, step: StepInputs, tables: PageTables, *, all_rows: bool = False
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(fp32 logits of step.sample_rows, or of every row with all_rows; the final stream [N, hc, dim]
        of every row)``; writes the step's KV rows into the arena."""
        h = self.embed_tokens(step.token_ids)
        # each layer's rotations share one table per positions tensor, and the torch references' index
        # arithmetic over the step's index tensors runs once per step (kernels/step_memo.py); a batch-invariant
        # model's attention references reduce over fixed key blocks (kernels/key_blocks.py), so a request's
        # attention does not depend on how wide the other requests of its step make the index lists
        with shared_rope_tables(), step_memo(), fixed_key_blocks(self.cfg.batch_invariant):
            for block in self.layers:
                h = block(h, step, tables)
        if all_rows:
            return self.head_logits(h), h
        if step.sample_rows.shape[0] == 0:
            return h.new_empty((0, self.cfg.vocab_size), dtype=torch.float32), h
        return self.head_logits(h[step.sample_rows]), h

    def pad_experts(self, rows: int = 1) -> None:
        """A padding step (data-parallel attention, a replica with nothing to run): every layer's MoE exchange
        with ``rows`` zero rows and nothing else (no attention, no KV page touched), so the expert ranks'
        collectives line up with the replicas running real steps."""
        for block in self.layers:
            block.ffn.pad_experts(rows, self.embed.weight.dtype)

    def commit(self, accepted: RowSubset, step: StepInputs, tables: PageTables) -> None:
        """Advance every layer's compressor state over the accepted drafts (``accepted``: their rows of the
        step just run)."""
        for block in self.layers:
            block.attn.commit(accepted, step, tables)

    def pending_commits(self) -> list:
        """What each layer keeps from a verify step's forward for :meth:`commit` (its projections; None where
        it keeps nothing). A decode step replayed from a CUDA graph runs no Python, so the runner takes these
        right after capturing a verify step and hands them back after each replay
        (:meth:`restore_pending_commits`)."""
        return [block.attn._pending for block in self.layers]

    def restore_pending_commits(self, pending: list) -> None:
        """Give every layer back what :meth:`pending_commits` returned."""
        for block, kept in zip(self.layers, pending, strict=True):
            block.attn._pending = kept

    def mtp_forward(self, h: torch.Tensor, step: StepInputs, tables: PageTables, head_rows: torch.Tensor
                    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The MTP block over rows ``h [T, hc, dim]`` of the main stream, where ``step`` carries each row's
        next token (``token_ids``), position and slot: ``(its output stream [T, hc, dim], the logits of
        head_rows)``; writes the MTP layer's rows into the arena."""
        if not self.mtp:
            raise ValueError("this model has no MTP layer (num_nextn_predict_layers = 0, or loaded without it)")
        block, rw = self.mtp[0], self.cfg.batch_invariant
        x = map_rows(block.mtp_input, rw, h, self.embed(step.token_ids))
        with fixed_key_blocks(rw):
            x = block(x, step, tables)
        return x, map_rows(self.logits, rw, map_rows(block.mtp_collapse, rw, x[head_rows]))
