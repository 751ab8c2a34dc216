"""The serving model's decoder blocks: the reference's parameters (:class:`BlockWeights`), arena attention
(:class:`ArenaAttention`), :class:`ServingMoE`, and a forward over one engine step.

A block runs ``h [T, hc, d]`` (every row of the step) through mHC and the attention norm, the arena
attention, mHC again, the FFN norm, the MoE and the last mHC fold: the reference block's math (the shared
``hc_pre`` / ``RMSNorm``, and :func:`hc_post_accumulate`, the reference's ``hc_post`` without its
``[T, 1 + hc, hc, d]`` fp32 temporary), with the step's tensors in place of the explicit cache. With
``cfg.batch_invariant`` the token-local parts run one row at a time (``map_rows``), as in the reference.
On a GPU backend the norms, rotations and mHC mixes run the kernel set's fused small ops, bound once
(:meth:`ServingBlock.bind_small_ops`).
"""

from __future__ import annotations

import torch

from atom.kernels.backend import KernelSet
from atom.model_ops.step_inputs import PageTables, StepInputs
from atom.models.deepseek_v4.block import BlockWeights, MTPWeights
from atom.models.deepseek_v4.fused_ops import SmallOpsUser, bind_small_ops
from atom.models.deepseek_v4.layers import map_rows

from .attention import ArenaAttention
from .moe import ServingMoE

__all__ = ["ServingBlock", "ServingMTPBlock", "hc_post_accumulate"]

#: the norms of a block whose output feeds FP8 linears, and those linears (paths in the block; absent ones skipped)
FP8_NORM_INPUTS = {"attn_norm": ("attn.wq_a", "attn.wkv", "attn.indexer.weights_proj"),
                   "attn.q_norm": ("attn.wq_b", "attn.indexer.wq_b"),
                   "ffn_norm": ("ffn.shared_experts.w1", "ffn.shared_experts.w3")}
#: the MTP block's input norms and the FP8 linears each feeds (besides :data:`FP8_NORM_INPUTS`)
MTP_FP8_NORM_INPUTS = {"enorm": ("e_proj",), "hnorm": ("h_proj",)}


def hc_post_accumulate(y: torch.Tensor, residual: torch.Tensor, post: torch.Tensor, comb: torch.Tensor
                       ) -> torch.Tensor:
    """``h'_k = post_k * y + sum_j comb[j, k] * residual_j`` -> ``[T, hc, d]``, accumulated in one fp32
    ``[T, hc, d]`` tensor term by term in the reference's order (post term first, then ``j = 0, 1, ...``),
    so it equals the reference ``hc_post`` bit for bit without its ``[T, 1 + hc, hc, d]`` fp32 stack
    (``(1 + hc) * hc`` stream-sized fp32 tensors: 20 for ``hc = 4``; here at most 2 at a time). Each term's
    operands are views taken by one ``unbind`` per input, so a term costs two ops (its product, its add)."""
    acc = post.unsqueeze(2) * y.float().unsqueeze(1)
    weights = comb.unsqueeze(3).unbind(1)  # comb[:, j, :, None] for each j: [T, hc (k), 1]
    for w, r in zip(weights, residual.unsqueeze(2).unbind(1)):  # r: residual[:, j] as [T, 1, d]
        acc += w * r.float()
    return acc.to(residual.dtype)


class ServingBlock(SmallOpsUser, BlockWeights):
    """Decoder block ``layer_id`` of the serving model."""

    attention_class = ArenaAttention
    ffn_class = ServingMoE
    attn: ArenaAttention
    ffn: ServingMoE
    fp8_norm_inputs = FP8_NORM_INPUTS  # the norms :meth:`bind_fp8_norms` binds, and the linears each feeds

    def bind_small_ops(self, kernels: KernelSet | None) -> None:
        """Run this block's small token-local ops with ``kernels``' fused kernels (``hc_pre`` / ``hc_post`` here;
        ``rms_norm``, ``rope``, ``rms_norm_rope`` in its norms, attention, compressors and indexer: every
        :class:`~atom.models.deepseek_v4.fused_ops.SmallOpsUser` in it), or with the reference's torch arithmetic op
        for op (None: the torch backend, whose engine is compared with the reference model value for value); then
        :meth:`bind_fp8_norms`. The serving model calls it once its linears' GEMMs are bound (``bind_arena``)."""
        bind_small_ops(self, kernels)
        self.bind_fp8_norms()

    def hc_mix(self, h: torch.Tensor, prefix: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``BlockWeights.hc_mix``; on a GPU backend one fused ``hc_pre`` launch (norm, gates, Sinkhorn, mix)."""
        k = self.small_ops
        if k is None:
            return super().hc_mix(h, prefix)
        c = self.cfg
        return k.hc_pre(h, getattr(self, f"{prefix}_fn"), getattr(self, f"{prefix}_scale"),
                        getattr(self, f"{prefix}_base"), c.hc_sinkhorn_iters, float(c.hc_eps), float(c.norm_eps))

    def ffn_sublayer(self, a: torch.Tensor, h: torch.Tensor, post: torch.Tensor, comb: torch.Tensor,
                     token_ids: torch.Tensor) -> torch.Tensor:
        """Token-local: fold the attention output ``a`` into the stream ``h``, then the FFN sub-layer."""
        k = self.small_ops
        fold = hc_post_accumulate if k is None else k.hc_post
        h = fold(a, h, post, comb)
        y, post, comb = self.hc_mix(h, "hc_ffn")
        return fold(self.ffn(self.ffn_norm(y), token_ids), h, post, comb)

    def bind_fp8_norms(self) -> None:
        """Give each norm of :attr:`fp8_norm_inputs` the activation block of the W8A8 linears it feeds (``Linear.w8a8``
        bound; 0 when none is, they disagree, or no fused kernel set is bound), so on a GPU backend it quantizes its
        output for them in its own launch (``rms_norm_fp8``) instead of each linear launching ``fp8_act_quant``."""
        for norm_path, linear_paths in self.fp8_norm_inputs.items():
            blocks = set()
            for path in linear_paths if self.small_ops is not None else ():
                try:
                    lin = self.get_submodule(path)
                except AttributeError:  # no indexer on this layer, no shared expert
                    continue
                if getattr(lin, "w8a8", None) is not None:
                    blocks.add(lin.act_block)
            self.get_submodule(norm_path).fp8_block = blocks.pop() if len(blocks) == 1 else 0

    def forward(self, h: torch.Tensor, step: StepInputs, tables: PageTables) -> torch.Tensor:
        """The new stream ``[T, hc, d]`` of the step's rows; writes their KV rows into the arena."""
        rw = self.cfg.batch_invariant
        x, post, comb = map_rows(self.attn_input, rw, h)
        a = self.attn(x, step, tables)
        return map_rows(self.ffn_sublayer, rw, a, h, post, comb, step.token_ids)


class ServingMTPBlock(MTPWeights, ServingBlock):
    """The MTP block of the serving model: the MTP parameters and input / collapse of :class:`MTPWeights`
    around a serving block (its SWA rows live in the arena like any layer's). On a GPU backend ``enorm`` /
    ``hnorm`` run the fused norm kernel like the block's own norms, quantizing for ``e_proj`` / ``h_proj`` in the
    same launch when those run W8A8 (``rms_norm_fp8``)."""

    fp8_norm_inputs = {**FP8_NORM_INPUTS, **MTP_FP8_NORM_INPUTS}

    def bind_small_ops(self, kernels: KernelSet | None) -> None:
        """:meth:`ServingBlock.bind_small_ops`, except ``norm``: the collapse (:meth:`mtp_collapse`) runs after the
        block with the LM head, whose norms keep the torch arithmetic (as the model's final ``norm`` does)."""
        super().bind_small_ops(kernels)
        self.norm.small_ops = None
