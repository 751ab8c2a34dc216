"""One DeepSeek-V4 decoder block (attention + MoE, each wrapped in mHC) and the MTP block built on it.

Block: ``h [T, hc, d]`` -> hc_pre -> attn_norm -> attention -> hc_post -> hc_pre -> ffn_norm -> MoE -> hc_post.
MTP block (sliding window only): its input is ``e_proj(enorm(embed(next_ids))) + h_proj(hnorm(h))`` per copy,
then the block, then its own head gate (``hc_head_*``) and ``norm``; the embedding and LM head are shared with
the main model and passed in.

``BlockWeights`` and ``MTPWeights`` are the parameter definitions (names, shapes, and the mHC mix and MTP
input / collapse that read them), shared with the serving model (:mod:`atom.models.deepseek_v4_serving`),
which builds its blocks from them with its own attention and MoE classes and its own forward. ``Block`` and
``MTPBlock`` are the reference's: the explicit-cache forward.
"""

from __future__ import annotations

import torch
from torch import nn

from .attention import Attention, AttentionWeights
from .cache import LayerCache
from .config import DeepseekV4Config
from .layers import Linear, RMSNorm, map_rows
from .mhc import hc_head, hc_post, hc_pre
from .moe import MoE, MoEWeights


def _hc_params(module: nn.Module, prefix: str, rows: int, cols: int, n_scale: int,
               device: torch.device | str | None) -> None:
    setattr(module, f"{prefix}_fn", nn.Parameter(torch.empty(rows, cols, dtype=torch.float32, device=device)))
    setattr(module, f"{prefix}_base", nn.Parameter(torch.empty(rows, dtype=torch.float32, device=device)))
    setattr(module, f"{prefix}_scale", nn.Parameter(torch.empty(n_scale, dtype=torch.float32, device=device)))


class BlockWeights(nn.Module):
    """The parameters of decoder block ``layer_id`` (MTP blocks use ids ``n_layers ..``): the two mHC mixes
    (``hc_attn_*``, ``hc_ffn_*``), the two norms, and the ``attn`` / ``ffn`` sub-layers of the classes a
    subclass names (``attention_class``, ``ffn_class``)."""

    attention_class: type[AttentionWeights]
    ffn_class: type[MoEWeights]

    def __init__(self, cfg: DeepseekV4Config, layer_id: int, *, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None, expert_format: str = "dense") -> None:
        """``expert_format``: the storage of the routed experts' Linears (see :class:`MoEWeights`)."""
        super().__init__()
        self.cfg, self.layer_id = cfg, layer_id
        kw = dict(dtype=dtype, device=device)
        mix = (2 + cfg.hc_mult) * cfg.hc_mult
        _hc_params(self, "hc_attn", mix, cfg.hc_mult * cfg.dim, 3, device)
        _hc_params(self, "hc_ffn", mix, cfg.hc_mult * cfg.dim, 3, device)
        self.attn_norm = RMSNorm(cfg.dim, cfg.norm_eps, **kw)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps, **kw)
        self.attn = self.attention_class(cfg, layer_id, **kw)
        self.ffn = self.ffn_class(cfg, layer_id, expert_format=expert_format, **kw)

    def hc_mix(self, h: torch.Tensor, prefix: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Token-local: ``hc_pre`` of the stream ``h`` with the mix ``prefix`` (``hc_attn`` / ``hc_ffn``):
        ``(sub-layer input [T, d], post, comb)``."""
        c = self.cfg
        return hc_pre(h, getattr(self, f"{prefix}_fn"), getattr(self, f"{prefix}_scale"),
                      getattr(self, f"{prefix}_base"), c.hc_sinkhorn_iters, c.hc_eps, c.norm_eps)

    def attn_input(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Token-local: ``(attn_norm(hc_pre(h)), post, comb)``."""
        y, post, comb = self.hc_mix(h, "hc_attn")
        return self.attn_norm(y), post, comb


class Block(BlockWeights):
    """The reference decoder block: one chunk over the explicit cache."""

    attention_class = Attention
    ffn_class = MoE

    def attn_output_and_ffn(self, a: torch.Tensor, h: torch.Tensor, post: torch.Tensor, comb: torch.Tensor,
                            token_ids: torch.Tensor) -> torch.Tensor:
        """Token-local: fold the attention output into the stream, then the whole FFN sub-layer."""
        h = hc_post(a, h, post, comb)
        y, post, comb = self.hc_mix(h, "hc_ffn")
        return hc_post(self.ffn(self.ffn_norm(y), token_ids), h, post, comb)

    def forward(self, h: torch.Tensor, token_ids: torch.Tensor, lc: LayerCache, start_pos: int) -> torch.Tensor:
        """``h [T, hc, d]`` of tokens ``token_ids [T]`` at ``start_pos ..`` -> new ``h``; updates ``lc``."""
        rw = self.cfg.batch_invariant
        x, post, comb = map_rows(self.attn_input, rw, h)
        a = self.attn(x, lc, start_pos)
        return map_rows(self.attn_output_and_ffn, rw, a, h, post, comb, token_ids)


class MTPWeights(BlockWeights):
    """The multi-token-prediction block's parameters on top of a block's: ``e_proj``, ``h_proj``, ``enorm``,
    ``hnorm``, ``norm`` and its head gate ``hc_head_*``; it predicts token t+2 from ``h_t`` and the
    embedding of token t+1. Combined with a block class (``MTPBlock(MTPWeights, Block)``)."""

    def __init__(self, cfg: DeepseekV4Config, layer_id: int, *, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None, expert_format: str = "dense") -> None:
        super().__init__(cfg, layer_id, dtype=dtype, device=device, expert_format=expert_format)
        kw = dict(dtype=dtype, device=device)
        self.e_proj = Linear(cfg.dim, cfg.dim, **kw)
        self.h_proj = Linear(cfg.dim, cfg.dim, **kw)
        self.enorm = RMSNorm(cfg.dim, cfg.norm_eps, **kw)
        self.hnorm = RMSNorm(cfg.dim, cfg.norm_eps, **kw)
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps, **kw)
        _hc_params(self, "hc_head", cfg.hc_mult, cfg.hc_mult * cfg.dim, 1, device)

    def mtp_input(self, h: torch.Tensor, next_emb: torch.Tensor) -> torch.Tensor:
        """Token-local: ``e_proj(enorm(emb)) + h_proj(hnorm(h))`` per copy -> ``[T, hc, d]``."""
        return self.e_proj(self.enorm(next_emb))[:, None] + self.h_proj(self.hnorm(h))

    def mtp_collapse(self, x: torch.Tensor) -> torch.Tensor:
        """Token-local: MTP head gate then ``norm`` -> ``[T, d]`` for the shared LM head."""
        c = self.cfg
        y = hc_head(x, self.hc_head_fn, self.hc_head_scale, self.hc_head_base, c.hc_eps, c.norm_eps)
        return self.norm(y)


class MTPBlock(MTPWeights, Block):
    """The reference MTP block over the explicit cache (its own SWA-only layer cache)."""

    def mtp_forward(self, h: torch.Tensor, next_emb: torch.Tensor, next_ids: torch.Tensor, lc: LayerCache,
                    start_pos: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(collapsed [T, d] ready for the shared head, new stream [T, hc, d])``."""
        c = self.cfg
        x = map_rows(self.mtp_input, c.batch_invariant, h, next_emb)
        x = self.forward(x, next_ids, lc, start_pos)
        return map_rows(self.mtp_collapse, c.batch_invariant, x), x
