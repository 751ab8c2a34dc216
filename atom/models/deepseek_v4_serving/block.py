"""The serving model's decoder blocks: the reference's parameters (:class:`BlockWeights`), arena attention
(:class:`ArenaAttention`), :class:`ServingMoE`, and a forward over one engine step.

A block runs ``h [T, hc, d]`` (every row of the step) through mHC and the attention norm, the arena
attention, mHC again, the FFN norm, the MoE and the last mHC fold: the reference block's math (the shared
``hc_pre`` / ``hc_post`` / ``RMSNorm``), with the step's tensors in place of the explicit cache. With
``cfg.batch_invariant`` the token-local parts run one row at a time (``map_rows``), as in the reference.
"""

from __future__ import annotations

import torch

from atom.model_ops.step_inputs import PageTables, StepInputs
from atom.models.deepseek_v4.block import BlockWeights, MTPWeights
from atom.models.deepseek_v4.layers import map_rows
from atom.models.deepseek_v4.mhc import hc_post

from .attention import ArenaAttention
from .moe import ServingMoE

__all__ = ["ServingBlock", "ServingMTPBlock"]


class ServingBlock(BlockWeights):
    """Decoder block ``layer_id`` of the serving model."""

    attention_class = ArenaAttention
    ffn_class = ServingMoE
    attn: ArenaAttention
    ffn: ServingMoE

    def attention_input(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Token-local: ``(attn_norm(hc_pre(h)), post, comb)``."""
        y, post, comb = self.hc_mix(h, "hc_attn")
        return self.attn_norm(y), post, comb

    def ffn_sublayer(self, a: torch.Tensor, h: torch.Tensor, post: torch.Tensor, comb: torch.Tensor,
                     token_ids: torch.Tensor) -> torch.Tensor:
        """Token-local: fold the attention output ``a`` into the stream ``h``, then the FFN sub-layer."""
        h = hc_post(a, h, post, comb)
        y, post, comb = self.hc_mix(h, "hc_ffn")
        return hc_post(self.ffn(self.ffn_norm(y), token_ids), h, post, comb)

    def forward(self, h: torch.Tensor, step: StepInputs, tables: PageTables) -> torch.Tensor:
        """The new stream ``[T, hc, d]`` of the step's rows; writes their KV rows into the arena."""
        rw = self.cfg.batch_invariant
        x, post, comb = map_rows(self.attention_input, rw, h)
        a = self.attn(x, step, tables)
        return map_rows(self.ffn_sublayer, rw, a, h, post, comb, step.token_ids)


class ServingMTPBlock(MTPWeights, ServingBlock):
    """The MTP block of the serving model: the MTP parameters and input / collapse of :class:`MTPWeights`
    around a serving block (its SWA rows live in the arena like any layer's)."""
