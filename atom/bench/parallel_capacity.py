"""Per-rank weights and KV capacity of the release models under tensor / expert parallelism.

Each of ``n`` ranks holds ``1/n`` of the split tensors (query heads and output groups, the routed and
shared experts, the vocabulary of the embedding and head; under ``--enable-expert-parallel`` ``E/n``
whole experts instead of a ``1/n`` slice of each, the same bytes) and all of the replicated ones
(latent KV projection, compressors, indexer, router, norms, mHC). The KV is one latent head (MQA),
so every rank computes and stores the full KV of every request: the group's token capacity is one
rank's. What grows with ``n`` is that capacity: each rank's KV budget is its device memory times the
utilization minus its weights, and its weights shrink.

Data-parallel attention (``D`` replicas of ``T`` ranks, ``D x T = n``) lets the group's KV grow with
``D``: each replica serves its own requests from its own arena, so the group holds ``D`` times one
rank's tokens. The price is in the weights: the routed experts stay split over all ``n`` ranks
(expert parallel), but the attention, the embedding and head and the shared expert are split over a
replica's ``T`` ranks only, i.e. every replica holds a full copy (:func:`dp_report`).

Weights are counted as a rank loads them on a GPU: FP8 linears (e4m3 + one e8m0 scale per 128x128
block), MXFP4 routed experts (packed pairs + one scale per 32 inputs), ``attn.wo_a`` dequantized to
bf16, the rest in its stored dtype (bf16, or fp32 for mHC, the sink and the router bias); without the
MTP block, which is not served (and not loaded). Tokens are the arena's at a 50% SWA block share
(:data:`atom.bench.capacity.LIVE_MIX`) with ``--max-live-requests`` request states held, as in the
capacity report; the arena rows are ``fp8_ds_mla``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import NamedTuple

from atom.config import CacheConfig, SchedulerConfig
from atom.kv.kv_layout import InsufficientKvMemory, KvLayout, plan_kv_layout
from atom.models.deepseek_v4.checkpoint import release_format, stored_dtype
from atom.models.deepseek_v4.config import DeepseekV4Config
from atom.models.deepseek_v4.model import DeepseekV4Model
from atom.parallel.shard_plan import ShardPlan

__all__ = ["ModelWeights", "model_weight_bytes", "rank_weight_bytes", "RankCapacity", "rank_capacity",
           "format_rank_capacity", "stored_bytes", "parallel_sizes", "report", "dp_layouts", "format_dp_capacity",
           "dp_kv_vs_tp", "dp_report", "DP_DEVICES_GIB", "DP_RANKS"]

GIB = 1 << 30
_ROUTED = re.compile(r"\.ffn\.experts\.\d+\.")  # the routed experts' tensors
_PER_EXPERT = re.compile(r"\.ffn\.(?:experts\.\d+\.|gate\.(?:weight|bias)$)")  # sized by the expert count
_DEQUANT_ON_LOAD = re.compile(r"attn\.wo_a\.weight$")


class ModelWeights(NamedTuple):
    """Weight bytes by how a group of ranks holds them (of the whole model, or what one rank holds).

    ``experts``: the routed experts, split (tensor parallel) or partitioned (expert parallel) over every
    rank of the group, the same bytes per rank either way. ``in_replica``: the tensors split over the
    ranks of one attention replica only (query heads and output groups, the vocabulary of the embedding
    and head, the shared expert): under tensor parallelism the replica is the whole group; under
    data-parallel attention every replica holds them in full. ``whole``: what every rank holds (norms,
    mHC, router, ``wq_a``, the latent KV projection, compressors, indexer)."""

    experts: int
    in_replica: int
    whole: int

    @property
    def sharded(self) -> int:
        """Bytes split or partitioned across some ranks (experts and the replica-split tensors)."""
        return self.experts + self.in_replica

    @property
    def replicated(self) -> int:
        return self.whole

    @property
    def total(self) -> int:
        return self.experts + self.in_replica + self.whole


def stored_bytes(name: str, shape: tuple[int, ...]) -> int:
    """Bytes tensor ``name`` of logical ``shape`` takes on a GPU rank in the release's formats (scales included)."""
    numel = math.prod(shape)
    fmt = release_format(name, fp8=True, fp4_experts=True)
    if fmt == "mxfp4":
        return numel // 2 + numel // 32
    if fmt == "fp8" and not _DEQUANT_ON_LOAD.search(name):
        return numel + math.ceil(shape[0] / 128) * math.ceil(shape[1] / 128)
    return numel * stored_dtype(name).itemsize


def model_weight_bytes(cfg: DeepseekV4Config) -> ModelWeights:
    """The whole model's weights in the release formats, by how ranks hold them (:class:`ModelWeights`;
    which tensors a rank splits is :class:`ShardPlan`'s answer). The model is enumerated on ``meta``
    with as few routed experts as it routes to, and the tensors sized by the expert count are scaled up
    to the real count."""
    few = max(cfg.n_activated_experts, 1)
    plan = ShardPlan(0, 1, n_experts=few)
    held = {kind: {False: 0, True: 0} for kind in ModelWeights._fields}  # kind -> per expert? -> bytes
    for name, t in DeepseekV4Model(cfg.replace(n_routed_experts=few), device="meta").state_dict().items():
        if name.startswith("mtp."):
            continue
        kind = "experts" if _ROUTED.search(name) else "in_replica" if plan.is_sharded(name) else "whole"
        held[kind][bool(_PER_EXPERT.search(name))] += stored_bytes(name, tuple(t.shape))
    out = {}
    for kind, parts in held.items():  # every expert-sized tensor comes ``few`` times: exact integer scaling
        assert parts[True] % few == 0
        out[kind] = parts[True] // few * cfg.n_routed_experts + parts[False]
    return ModelWeights(**out)


def rank_weight_bytes(whole: ModelWeights, size: int, replicas: int = 1) -> ModelWeights:
    """What one of ``size`` ranks holds of a model whose weights are ``whole``, the ranks forming
    ``replicas`` attention replicas of ``size // replicas`` ranks each: experts over all ``size`` ranks,
    the replica-split tensors over a replica's ranks (``replicas=1``: tensor parallelism)."""
    if size % replicas:
        raise ValueError(f"{size} ranks do not form {replicas} replicas of equal size")
    return ModelWeights(-(-whole.experts // size), -(-whole.in_replica // (size // replicas)), whole.whole)


@dataclass(frozen=True)
class RankCapacity:
    """One layout: a rank's weights, its KV budget and the tokens its arena (= its replica) holds."""

    size: int  # ranks in the group
    weights: ModelWeights
    kv_budget: int  # <= 0: the weights alone do not fit
    layout: KvLayout | None  # None: no arena (no budget, or less than one 1M-token request needs)
    tokens: int  # KV tokens of one rank's arena (every rank of a replica holds the replica's KV); 0 without one
    replicas: int = 1

    @property
    def group_tokens(self) -> int:
        """KV tokens of the group: each replica holds its own requests' KV."""
        return self.replicas * self.tokens


def rank_capacity(cfg: DeepseekV4Config, whole: ModelWeights, size: int, device_bytes: int, utilization: float,
                  live: int, replicas: int = 1) -> RankCapacity:
    """A rank of ``size`` (``replicas`` attention replicas) serving ``cfg`` (weights ``whole``,
    :func:`model_weight_bytes`) on a device of ``device_bytes`` of which ``utilization`` is used, with
    ``live`` request states held in its replica's arena."""
    from atom.bench.capacity import LIVE_MIX, chunked_capacity, state_chunks

    weights = rank_weight_bytes(whole, size, replicas)
    budget = int(device_bytes * utilization) - weights.total
    spec = cfg.kv_spec("fp8_ds_mla")
    if budget <= 0:
        return RankCapacity(size, weights, budget, None, 0, replicas)
    try:
        lay = plan_kv_layout(spec, CacheConfig(kv_cache_bytes=budget),
                             SchedulerConfig(max_num_seqs=live, max_model_len=1 << 20))
    except InsufficientKvMemory:  # the arena is planned to hold one 1M-token request
        return RankCapacity(size, weights, budget, None, 0, replicas)
    chunks = lay.num_chunks - state_chunks(lay, live)
    tokens = spec.block_size * chunked_capacity(LIVE_MIX, chunks, lay.chunk_pages, lay.compress_pages_per_chunk)
    return RankCapacity(size, weights, budget, lay, tokens, replicas)


def format_rank_capacity(preset: str, rows: list[RankCapacity], device_gib: float, utilization: float) -> str:
    lines = [f"## {preset} per rank: {device_gib:g} GiB device x {utilization:g} utilization; the latent KV is one "
             "head, so every rank holds the full KV of every request and the group holds what one rank holds",
             "| ranks | weights per rank GiB (split + replicated) | KV budget per rank GiB | KV tokens per rank = group |",
             "|---|---|---|---|"]
    for r in rows:
        w = r.weights
        kv = f"{r.kv_budget / GIB:.1f}" if r.kv_budget > 0 else "weights do not fit"
        lines.append(f"| {r.size} | {w.total / GIB:.1f} ({w.sharded / GIB:.1f} + {w.replicated / GIB:.1f}) | {kv} | "
                     f"{r.tokens:,} |")
    return "\n".join(lines)


def parallel_sizes(cfg: DeepseekV4Config, up_to: int = 16) -> list[int]:
    """The powers of two up to ``up_to`` that split ``cfg`` (tensor-parallel attention)."""
    return [n for n in ShardPlan().valid_sizes(cfg, up_to) if n & (n - 1) == 0]


def report(presets: tuple[str, ...], device_gib: float, utilization: float, live: int) -> str:
    """The per-rank tables of ``presets`` (one enumeration of each model)."""
    out = []
    for preset in presets:
        cfg = DeepseekV4Config.from_preset(preset)
        whole = model_weight_bytes(cfg)
        rows = [rank_capacity(cfg, whole, n, int(device_gib * GIB), utilization, live) for n in parallel_sizes(cfg)]
        out.append(format_rank_capacity(preset, rows, device_gib, utilization))
    return "\n\n".join(out)


DP_DEVICES_GIB = (80.0, 141.0)  # device sizes of the data-parallel tables (H100 / H200 class)
DP_RANKS = (8, 16)  # group sizes of the data-parallel tables


def dp_layouts(cfg: DeepseekV4Config, ranks: int) -> list[tuple[int, int]]:
    """The ``(replicas, ranks per replica)`` layouts of ``ranks`` ranks serving ``cfg``: the ranks per
    replica a size that splits its attention (:meth:`ShardPlan.valid_sizes`), and, for more than one
    replica, the routed experts partitioned evenly over all ranks. ``(1, ranks)`` is tensor
    parallelism; ``(ranks, 1)`` data-parallel attention with expert parallelism."""
    tp_sizes = ShardPlan().valid_sizes(cfg, ranks)
    return [(ranks // t, t) for t in sorted(tp_sizes, reverse=True)
            if ranks % t == 0 and (t == ranks or cfg.n_routed_experts % ranks == 0)]


def layout_name(replicas: int, tp: int) -> str:
    if replicas == 1:
        return f"TP{tp}"
    ranks = replicas * tp
    return f"DP{replicas}+EP{ranks}" if tp == 1 else f"DP{replicas}xTP{tp}+EP{ranks}"


def format_dp_capacity(preset: str, rows: list[RankCapacity], device_gib: float, utilization: float) -> str:
    """One model on one device size: each layout's weights per rank, KV budget, tokens per replica and
    for the group, and the group's tokens over tensor parallelism's at the same rank count."""
    lines = [f"## {preset} data-parallel attention: {device_gib:g} GiB devices x {utilization:g} utilization; "
             "each replica holds its own requests' KV, the experts are split over every rank",
             "| ranks | layout | weights per rank GiB (experts + replica-split + whole) | KV budget per rank GiB | "
             "KV tokens per replica | group KV tokens | group vs TP |",
             "|---|---|---|---|---|---|---|"]
    tp_tokens = {r.size: r.group_tokens for r in rows if r.replicas == 1}
    for r in rows:
        w = r.weights
        kv = "weights do not fit" if r.kv_budget <= 0 else f"{r.kv_budget / GIB:.1f}" if r.layout else \
            f"{r.kv_budget / GIB:.1f} (less than one 1M-token request)"
        tp = tp_tokens.get(r.size)
        if r.replicas == 1:
            vs = "-"
        elif tp is None:
            vs = f"TP{r.size} does not split this model"
        else:
            vs = "no KV" if not r.group_tokens else f"{r.group_tokens / tp:.2f}x" if tp else "TP holds no KV"
        lines.append(f"| {r.size} | {layout_name(r.replicas, r.size // r.replicas)} | {w.total / GIB:.1f} "
                     f"({w.experts / GIB:.1f} + {w.in_replica / GIB:.1f} + {w.whole / GIB:.1f}) | {kv} | "
                     f"{r.tokens:,} | {r.group_tokens:,} | {vs} |")
    return "\n".join(lines)


def dp_rows(cfg: DeepseekV4Config, whole: ModelWeights, device_gib: float, utilization: float, live: int,
            ranks: tuple[int, ...] = DP_RANKS) -> list[RankCapacity]:
    """Every layout of each group size in ``ranks`` (:func:`dp_layouts`), tensor parallelism first."""
    return [rank_capacity(cfg, whole, n, int(device_gib * GIB), utilization, live, d)
            for n in ranks for d, _ in dp_layouts(cfg, n)]


def dp_kv_vs_tp(cfg: DeepseekV4Config, whole: ModelWeights, ranks: int, device_gib: float, utilization: float,
                live: int) -> float:
    """Group KV tokens of ``ranks`` ranks under data-parallel attention with expert parallelism (one rank
    per replica) over tensor parallelism's on the same devices."""
    dp, tp = (rank_capacity(cfg, whole, ranks, int(device_gib * GIB), utilization, live, d) for d in (ranks, 1))
    if tp.group_tokens == 0:
        raise ValueError(f"{ranks} ranks of {device_gib:g} GiB cannot hold the weights under tensor parallelism")
    return dp.group_tokens / tp.group_tokens


def dp_report(presets: tuple[str, ...], utilization: float, live: int) -> str:
    """The data-parallel tables of ``presets`` on :data:`DP_DEVICES_GIB` devices, then the summary line
    ``dp_kv_vs_tp flash_8=<x> pro_16=<y>`` (141 GiB devices, 0.9 utilization, whatever ``utilization`` is)."""
    out, weights = [], {}
    for preset in presets:
        cfg = DeepseekV4Config.from_preset(preset)
        weights[preset] = cfg, model_weight_bytes(cfg)
        for gib in DP_DEVICES_GIB:
            out.append(format_dp_capacity(preset, dp_rows(cfg, weights[preset][1], gib, utilization, live),
                                          gib, utilization))
    flash = dp_kv_vs_tp(*weights["deepseek_v4_flash"], 8, 141.0, 0.9, live)
    pro = dp_kv_vs_tp(*weights["deepseek_v4_pro"], 16, 141.0, 0.9, live)
    out.append(f"dp_kv_vs_tp flash_8={flash:.3f} pro_16={pro:.3f}")
    return "\n\n".join(out)
