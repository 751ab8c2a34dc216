"""The DeepSeek-V4 reference model with an explicit per-sequence cache.

Entry points (all run under ``torch.no_grad``):

* ``new_cache(capacity, poison=None) -> SequenceCache``: a clean cache (or a NaN-poisoned one for restore tests).
* ``prefill(cache, tokens) -> ForwardOutput``: reset ``cache`` and run ``tokens`` from position 0.
* ``extend(cache, tokens, start_pos) -> ForwardOutput``: run any chunk (1 token = decode) at ``start_pos``, which
  must equal ``cache.num_tokens``.  Logits are returned for *every* position of the chunk.
* ``forward_batch(caches, chunks, start_positions)``: several sequences of different lengths (looped).
* ``mtp_extend(cache, hidden, next_tokens, start_pos) -> logits``: the MTP head for the same positions.
* ``snapshot(cache)`` / ``restore(snap, cache)``: the dsv4_model.md section 4.2 boundary state.
* ``bind_kernels(kernel_set)``: the GEMM implementation of the Linears that keep quantized weights.
* ``cast_fp32_weights()``: the router and compressor weights held in fp32 (``load_checkpoint`` calls it).

Prefill, chunked extend and decode run the same per-token code path (see attention.py / compressor.py), so the
caches and logits do not depend on the chunking; with ``cfg.batch_invariant`` they are bit-identical.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from atom.comm import SINGLE_RANK, Comm

from . import cache as cache_mod
from .block import Block, BlockWeights, MTPBlock, MTPWeights
from .cache import CacheSnapshot, SequenceCache
from .compressor import Compressor
from .config import DeepseekV4Config
from .layers import Embedding, Linear, RMSNorm, map_rows
from .mhc import hc_head
from .moe import Gate


class ForwardOutput(NamedTuple):
    """``logits [T, vocab]`` (fp32) for every position of the chunk and the final mHC stream ``[T, hc, dim]``."""

    logits: torch.Tensor
    hidden: torch.Tensor


class ModelWeights(nn.Module):
    """DeepSeek-V4's parameters with official names (``embed``, ``layers.N.*``, ``mtp.0.*``, ``norm``, ``head``,
    ``hc_head_*``) and the token-local ends of a forward (embedding, head); the blocks are of the classes
    a subclass names (``block_class``, ``mtp_class``). Shared by the reference :class:`DeepseekV4Model` and
    the serving model, so both load the same checkpoint."""

    block_class: type[BlockWeights]
    mtp_class: type[MTPWeights]

    def __init__(self, cfg: DeepseekV4Config, *, dtype: torch.dtype = torch.float32,
                 device: torch.device | str | None = None, expert_format: str = "dense") -> None:
        """``expert_format``: the storage of every routed expert's Linears (``dense``, ``fp8``, ``mxfp4``; see
        :class:`~atom.models.deepseek_v4.moe.MoEWeights`); every other Linear is built dense."""
        super().__init__()
        self.cfg = cfg
        kw = dict(dtype=dtype, device=device)
        self.embed = Embedding(cfg.vocab_size, cfg.dim, **kw)
        self.layers = nn.ModuleList(self.block_class(cfg, i, expert_format=expert_format, **kw)
                                    for i in range(cfg.n_layers))
        self.mtp = nn.ModuleList(self.mtp_class(cfg, cfg.n_layers + i, expert_format=expert_format, **kw)
                                 for i in range(cfg.n_mtp_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps, **kw)
        self.head = Linear(cfg.dim, cfg.vocab_size, **kw)
        self.hc_head_fn = nn.Parameter(torch.empty(cfg.hc_mult, cfg.hc_mult * cfg.dim, device=device))
        self.hc_head_base = nn.Parameter(torch.empty(cfg.hc_mult, device=device))
        self.hc_head_scale = nn.Parameter(torch.empty(1, device=device))
        self.comm: Comm = SINGLE_RANK  # vocab parallel: the head's slices are gathered through it

    def bind_kernels(self, kernels: object) -> None:
        """Run every quantized Linear's GEMM with ``kernels``' implementation (a ``KernelSet``; None: torch)."""
        for module in self.modules():
            if isinstance(module, Linear):
                module.bind_gemm(kernels)

    def cast_fp32_weights(self) -> None:
        """Hold the router (``Gate.weight``, and its bias where a ``.to()`` made it narrower) and compressor
        (``wkv`` / ``wgate``) weights in fp32: their GEMMs run in fp32 (``weight.float()`` in ``Gate.scores`` and
        ``Compressor.project_raw``), which then returns the weight itself instead of copying it on every call.
        Same values (a widening cast is exact), so the same results bit for bit. ``load_checkpoint`` calls it, and
        the serving model again when it binds its kernels (after a ``.to()`` that narrowed them)."""
        for module in self.modules():
            if isinstance(module, Gate):
                weights = [module.weight] if module.bias is None else [module.weight, module.bias]
            elif isinstance(module, Compressor):
                weights = [module.wkv.weight, module.wgate.weight]
            else:
                continue
            for w in weights:
                if w.is_floating_point() and w.dtype != torch.float32:
                    w.data = w.data.float()

    # ----- pieces -------------------------------------------------------------------------------------------------
    def embed_tokens(self, tokens: torch.Tensor) -> torch.Tensor:
        """``[T] -> [T, hc, dim]``: the embedding copied ``hc_mult`` times."""
        e = self.embed(tokens)
        return e[:, None, :].expand(-1, self.cfg.hc_mult, -1).clone()

    def logits(self, collapsed: torch.Tensor) -> torch.Tensor:
        """fp32 LM head over ``[T, dim]`` (already normalised); vocab parallel: slices gathered in order."""
        return self.comm.all_gather(F.linear(collapsed.float(), self.head.weight.float()), dim=-1)

    def head_logits(self, h: torch.Tensor) -> torch.Tensor:
        """Head gate (no Sinkhorn), final RMSNorm, fp32 head: ``[T, hc, dim] -> [T, vocab]``."""
        c = self.cfg

        def one(hh: torch.Tensor) -> torch.Tensor:
            y = hc_head(hh, self.hc_head_fn, self.hc_head_scale, self.hc_head_base, c.hc_eps, c.norm_eps)
            return self.logits(self.norm(y))

        return map_rows(one, c.batch_invariant, h)



class DeepseekV4Model(ModelWeights):
    """The reference DeepSeek-V4 model: chunks of one sequence over its explicit cache (module docstring)."""

    block_class = Block
    mtp_class = MTPBlock

    # ----- caches -------------------------------------------------------------------------------------------------
    def new_cache(self, capacity: int, *, poison: float | None = None) -> SequenceCache:
        """A cache for one sequence of up to ``capacity`` tokens (fp32 rows on the model's device)."""
        return cache_mod.new_cache(self.cfg, capacity, device=self.embed.weight.device, poison=poison)

    def snapshot(self, cache: SequenceCache) -> CacheSnapshot:
        return cache_mod.snapshot(cache, self.cfg.window_size)

    def restore(self, snap: CacheSnapshot, cache: SequenceCache) -> None:
        cache_mod.restore(snap, cache, self.cfg.window_size)

    # ----- forward ------------------------------------------------------------------------------------------------
    @torch.no_grad()
    def prefill(self, cache: SequenceCache, tokens: torch.Tensor) -> ForwardOutput:
        """Start a new sequence in ``cache`` (state reset) and run ``tokens`` from position 0."""
        cache_mod.reset(cache)
        return self.extend(cache, tokens, 0)

    @torch.no_grad()
    def extend(self, cache: SequenceCache, tokens: torch.Tensor, start_pos: int) -> ForwardOutput:
        """Run ``tokens [T]`` at positions ``start_pos .. start_pos+T-1`` and advance ``cache.num_tokens``."""
        tokens = torch.as_tensor(tokens, dtype=torch.long, device=self.embed.weight.device).reshape(-1)
        if start_pos != cache.num_tokens:
            raise ValueError(f"extend at start_pos={start_pos} but the cache holds {cache.num_tokens} tokens")
        if start_pos + tokens.numel() > cache.capacity:
            raise ValueError(f"cache capacity {cache.capacity} exceeded by {start_pos + tokens.numel()} tokens")
        if tokens.numel() == 0:
            raise ValueError("extend needs at least one token")
        h = self.embed_tokens(tokens)
        for i, block in enumerate(self.layers):
            h = block(h, tokens, cache.layers[i], start_pos)
        cache.num_tokens = start_pos + tokens.numel()
        return ForwardOutput(self.head_logits(h), h)

    @torch.no_grad()
    def forward_batch(self, caches: list[SequenceCache], chunks: list[torch.Tensor],
                      start_positions: list[int]) -> list[ForwardOutput]:
        """Extend several independent sequences (each with its own cache); results equal separate calls."""
        if not len(caches) == len(chunks) == len(start_positions):
            raise ValueError("caches, chunks and start_positions must have the same length")
        return [self.extend(c, t, p) for c, t, p in zip(caches, chunks, start_positions)]

    @torch.no_grad()
    def mtp_extend(self, cache: SequenceCache, hidden: torch.Tensor, next_tokens: torch.Tensor,
                   start_pos: int) -> torch.Tensor:
        """MTP logits ``[T, vocab]``: position t sees main stream ``hidden[t]`` and token ``next_tokens[t]``
        (= token t+1) and predicts token t+2.  Uses the MTP layer's own SWA cache (``cache.mtp_tokens``)."""
        if not self.mtp:
            raise ValueError("this model has no MTP layer (n_mtp_layers = 0, or loaded with load_mtp=False)")
        if start_pos != cache.mtp_tokens:
            raise ValueError(f"mtp_extend at start_pos={start_pos} but MTP has seen {cache.mtp_tokens} tokens")
        next_tokens = torch.as_tensor(next_tokens, dtype=torch.long, device=hidden.device).reshape(-1)
        block = self.mtp[0]
        y, _ = block.mtp_forward(hidden, self.embed(next_tokens), next_tokens, cache.layers[self.cfg.n_layers],
                                 start_pos)
        cache.mtp_tokens = start_pos + next_tokens.numel()
        return map_rows(self.logits, self.cfg.batch_invariant, y)
