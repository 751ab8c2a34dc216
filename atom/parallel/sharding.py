"""Turning a DeepSeek-V4 model built on the ``meta`` device into one rank's shard.

:func:`shard_model` (the reference or the serving model: both declare the same parameters) gives
every parameter its local shape (from the :class:`ShardPlan`), removes the routed experts another rank
owns, sets the local head / group counts and hands the layers that combine partial results their
:class:`Comm`; ``to_empty`` then allocates only what the rank holds
(no full-size tensor is ever materialised). The weights come from :mod:`shard_loader`. Under
data-parallel attention (``plan.replicas > 1``) the dense layers get the replica's :class:`Comm` and each
MoE layer an :class:`ExpertExchange` over all ranks.

A quantized Linear keeps its stored format on every rank: an FP8 slice holds its rows / columns of
e4m3 values and the 128x128 block scales covering them, an MXFP4 slice its packed nibbles and the
scales of its groups of 32 inputs. With ``quant_sim`` a row-parallel quantized layer keeps the
whole layer's FP8 input block; when one block spans several ranks' inputs it is a
:class:`SplitInputLinear`, which exchanges the blocks' maxima so every input rounds as on one rank.

:func:`parameter_bytes` reports what a rank holds, split into the sharded tensors (about ``1/n`` of
their full size per rank) and the replicated ones (norms, mHC, router, latent KV, indexer).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from atom.kernels.quant_formats import FP4_GROUP
from atom.models.deepseek_v4.layers import Embedding, Linear
from atom.models.deepseek_v4.model import ModelWeights
from atom.models.deepseek_v4.moe import MoEWeights
from atom.models.deepseek_v4.quant import WEIGHT_BLOCK, fp8_scale
from atom.comm import Comm
from atom.parallel.expert_exchange import ExpertExchange
from atom.parallel.shard_plan import ShardPlan, Split

__all__ = ["VocabParallelEmbedding", "SplitInputLinear", "shard_model", "check_quantized_split", "ParameterBytes", "parameter_bytes", "local_shape"]


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


def shard_model(model: ModelWeights, plan: ShardPlan, comm: Comm, device: torch.device | str,
                expert_comm: Comm | None = None) -> ModelWeights:
    """Shard ``model`` (built on ``meta``, its Linears already in their stored formats) in place for ``plan``
    and allocate it (uninitialised) on ``device``; ``ValueError`` naming a quantized weight whose split would
    cut its scale blocks. ``comm``: the ranks of this rank's attention replica (all ranks when
    ``plan.replicas == 1``); ``expert_comm``: every rank (needed when ``plan.replicas > 1``: each MoE layer
    then exchanges its routed rows over it, :class:`ExpertExchange`)."""
    cfg = model.cfg
    assert model.embed.weight.is_meta, "shard a model built on the meta device"
    if plan.replicas > 1 and expert_comm is None:
        raise ValueError(f"a plan of {plan.replicas} attention replicas needs expert_comm (the group of all "
                         f"{plan.size} ranks)")
    expert_comm = comm if expert_comm is None else expert_comm
    assert (comm.rank, comm.size) == (plan.dense_rank, plan.dense_size), (comm.rank, comm.size, plan)
    assert (expert_comm.rank, expert_comm.size) == (plan.rank, plan.size), (expert_comm.rank, expert_comm.size, plan)
    plan.check(cfg)
    if plan.sharded:
        _shard_modules(model, plan, comm, expert_comm)
        linears = {path for path, mod in model.named_modules() if isinstance(mod, Linear)}
        for path in sorted(linears):
            spec = plan.spec(f"{path}.weight")
            if isinstance(spec, Split):
                _shard_linear(model, path, spec, expert_comm if ".experts." in path else comm)
        for name, param in list(model.named_parameters()):
            spec = plan.spec(name)
            if isinstance(spec, Split) and name.rpartition(".")[0] not in linears:
                owner, attr = _owner(model, name)
                shape = local_shape(tuple(param.shape), spec)
                setattr(owner, attr, nn.Parameter(torch.empty(shape, dtype=param.dtype, device="meta")))
    return model.to_empty(device=device)


def _shard_linear(model: ModelWeights, path: str, spec: Split, comm: Comm) -> None:
    """Give the Linear at ``path`` its local features in its stored format; a layer whose FP8 input blocks
    span ranks becomes a :class:`SplitInputLinear` (same parameters, exact input quantization)."""
    mod: Linear = model.get_submodule(path)
    full = (mod.out_features, mod.in_features)
    out_f, in_f = local_shape(full, spec)
    check_quantized_split(f"{path}.weight", mod.fmt, full, spec)
    block = mod.act_block  # the whole layer's activation block, kept so the numerics do not change
    span = 1
    if spec.dim == 1 and block and in_f % block:
        if block % in_f:
            raise ValueError(f"{path}: each rank's {in_f} inputs of {full[1]} do not tile the {block}-wide FP8 "
                             f"blocks of its input quantization; use a parallel size that does")
        span = block // in_f
    owner, attr = _owner(model, path)
    new = Linear(in_f, out_f, dtype=mod.dtype, device="meta") if span == 1 else \
        SplitInputLinear(in_f, out_f, comm, span, dtype=mod.dtype, device="meta")
    new.set_format(mod.fmt, act_quant=bool(block))
    new.act_block = block
    setattr(owner, attr, new)


def check_quantized_split(name: str, fmt: str, full: tuple[int, int], spec: Split) -> None:
    """``ValueError`` unless each rank's slice of quantized weight ``name`` (logical ``[out, in]``) can keep its
    stored format exactly: an FP8 slice must be whole 128-wide scale blocks or lie inside one block (it then
    holds that block's scale); an MXFP4 slice of the inputs must be whole groups of 32."""
    length = local_shape(full, spec)[spec.dim]
    if fmt == "fp8" and length % WEIGHT_BLOCK and WEIGHT_BLOCK % length:
        raise ValueError(f"fp8 weight {name} {full}: slices of {length} along dim {spec.dim} cut its "
                         f"{WEIGHT_BLOCK}x{WEIGHT_BLOCK} scale blocks; use a parallel size whose slices are whole "
                         f"blocks or fit inside one")
    if fmt == "mxfp4" and spec.dim == 1 and length % FP4_GROUP:
        raise ValueError(f"mxfp4 weight {name} {full}: slices of {length} inputs cut its groups of {FP4_GROUP} "
                         f"inputs sharing one scale; use --enable-expert-parallel (whole experts per rank) or a "
                         f"parallel size that leaves each rank a multiple of {FP4_GROUP} expert inputs")


class SplitInputLinear(Linear):
    """A row-parallel quantized Linear whose input FP8 blocks (``act_block`` wide) span ``span`` ranks: the
    block's scale needs the largest magnitude over every rank's part, so the parts' maxima are all-gathered
    (an exact max) and each rank quantizes its inputs with its block's scale, as the unsplit layer does."""

    def __init__(self, in_features: int, out_features: int, comm: Comm, span: int, *,
                 dtype: torch.dtype | None = None, device: torch.device | str | None = None) -> None:
        super().__init__(in_features, out_features, dtype=dtype, device=device)
        self.comm, self.span = comm, span

    def quantize_input(self, x: torch.Tensor) -> torch.Tensor:
        parts = self.comm.all_gather(x.float().abs().amax(-1, keepdim=True), dim=1)  # [M, ranks]
        first = self.comm.rank // self.span * self.span
        scale = fp8_scale(parts[:, first : first + self.span].amax(-1, keepdim=True))
        return ((x.float() / scale).to(torch.float8_e4m3fn).float() * scale).to(x.dtype)


def _shard_modules(model: ModelWeights, plan: ShardPlan, comm: Comm, expert_comm: Comm) -> None:
    cfg, n = model.cfg, plan.dense_size
    if n > 1:
        start, _ = Split(0, plan.dense_rank, n).bounds(cfg.vocab_size)
        # full-size on meta: the parameter loop below gives it its local rows like every other tensor
        model.embed = VocabParallelEmbedding(cfg.vocab_size, cfg.dim, start, comm,
                                             dtype=model.embed.weight.dtype, device="meta")
    model.comm = comm
    for block in list(model.layers) + list(model.mtp):
        if plan.split_attention and n > 1:
            block.attn.n_heads = cfg.n_heads // n
            block.attn.n_groups = cfg.o_groups // n
            block.attn.comm = comm
        moe: MoEWeights = block.ffn
        moe.expert_range = plan.expert_range() if plan.expert_parallel else range(cfg.n_routed_experts)
        moe.comm = comm
        if plan.replicas > 1:
            if not hasattr(moe, "exchange"):
                raise ValueError(f"{type(moe).__name__} cannot run under data-parallel attention: the serving "
                                 "model's MoE (ServingMoE) dispatches its rows to the expert ranks")
            moe.exchange = ExpertExchange(expert_comm, cfg.n_routed_experts, expert_parallel=plan.expert_parallel,
                                          replica=comm)
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

