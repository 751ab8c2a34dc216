"""Turning a DeepSeek-V4 model built on the ``meta`` device into one rank's shard.

:func:`shard_model` gives every parameter its local shape (from the :class:`ShardPlan`), removes the
routed experts another rank owns, sets the local head / group counts and hands the layers that
combine partial results their :class:`Comm`; ``to_empty`` then allocates only what the rank holds
(no full-size tensor is ever materialised). The weights come from :mod:`shard_loader`.

:func:`parameter_bytes` reports what a rank holds, split into the sharded tensors (about ``1/n`` of
their full size per rank) and the replicated ones (norms, mHC, router, latent KV, indexer).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from atom.models.deepseek_v4.layers import Embedding
from atom.models.deepseek_v4.model import DeepseekV4Model
from atom.models.deepseek_v4.moe import MoE
from atom.comm import Comm
from atom.parallel.shard_plan import ShardPlan, Split

__all__ = ["VocabParallelEmbedding", "shard_model", "ParameterBytes", "parameter_bytes", "local_shape"]


class VocabParallelEmbedding(Embedding):
    """Rows ``start .. start + len(weight)`` of the embedding; ids outside them contribute zeros and the
    ranks' lookups are summed, which gives every rank the exact full lookup."""

    def __init__(self, rows: int, dim: int, start: int, comm: Comm, *, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None) -> None:
        super().__init__(rows, dim, dtype=dtype, device=device)
        self.start, self.comm = start, comm

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        local = ids - self.start
        outside = (local < 0) | (local >= self.weight.shape[0])
        e = F.embedding(local.masked_fill(outside, 0), self.weight)
        return self.comm.all_reduce(e.masked_fill(outside[..., None], 0))


def local_shape(shape: tuple[int, ...], spec: Split | None) -> tuple[int, ...]:
    if spec is None:
        return tuple(shape)
    start, stop = spec.bounds(shape[spec.dim])
    out = list(shape)
    out[spec.dim] = stop - start
    return tuple(out)


def shard_model(model: DeepseekV4Model, plan: ShardPlan, comm: Comm, device: torch.device | str) -> DeepseekV4Model:
    """Shard ``model`` (built on ``meta``) in place for ``plan`` and allocate it (uninitialised) on ``device``."""
    cfg = model.cfg
    assert model.embed.weight.is_meta, "shard a model built on the meta device"
    assert comm.size == plan.size and comm.rank == plan.rank, (comm.rank, comm.size, plan)
    plan.check(cfg)
    if plan.sharded:
        _shard_modules(model, plan, comm)
        for name, param in list(model.named_parameters()):
            spec = plan.spec(name)
            if isinstance(spec, Split):
                owner, attr = _owner(model, name)
                shape = local_shape(tuple(param.shape), spec)
                setattr(owner, attr, nn.Parameter(torch.empty(shape, dtype=param.dtype, device="meta")))
    return model.to_empty(device=device)


def _shard_modules(model: DeepseekV4Model, plan: ShardPlan, comm: Comm) -> None:
    cfg, n = model.cfg, plan.size
    start, _ = Split(0, plan.rank, n).bounds(cfg.vocab_size)
    # full-size on meta: the parameter loop below gives it its local rows like every other tensor
    model.embed = VocabParallelEmbedding(cfg.vocab_size, cfg.dim, start, comm,
                                         dtype=model.embed.weight.dtype, device="meta")
    model.comm = comm
    for block in list(model.layers) + list(model.mtp):
        if plan.split_attention:
            block.attn.n_heads = cfg.n_heads // n
            block.attn.n_groups = cfg.o_groups // n
            block.attn.comm = comm
        moe: MoE = block.ffn
        moe.expert_range = plan.expert_range()
        moe.comm = comm
        for e in range(cfg.n_routed_experts):
            if e not in moe.expert_range:
                moe.experts[e] = nn.Module()  # another rank's expert: nothing held here


def _owner(model: nn.Module, name: str) -> tuple[nn.Module, str]:
    path, _, attr = name.rpartition(".")
    return (model.get_submodule(path) if path else model), attr


class ParameterBytes(NamedTuple):
    """Bytes of parameters one rank holds: ``sharded`` (split or partitioned tensors), ``replicated``."""

    sharded: int
    replicated: int

    @property
    def total(self) -> int:
        return self.sharded + self.replicated


def parameter_bytes(model: nn.Module, plan: ShardPlan) -> ParameterBytes:
    """What ``model`` (one rank's shard) holds; the expert tensors count as sharded under expert parallel."""
    sharded = replicated = 0
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        size = t.numel() * t.element_size()
        if plan.is_sharded(name):
            sharded += size
        else:
            replicated += size
    return ParameterBytes(sharded, replicated)

