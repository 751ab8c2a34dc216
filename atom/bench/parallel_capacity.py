"""Per-rank weights and KV capacity of the release models under tensor / expert parallelism.

Each of ``n`` ranks holds ``1/n`` of the split tensors (query heads and output groups, the routed and
shared experts, the vocabulary of the embedding and head; under ``--enable-expert-parallel`` ``E/n``
whole experts instead of a ``1/n`` slice of each, the same bytes) and all of the replicated ones
(latent KV projection, compressors, indexer, router, norms, mHC). The KV is one latent head (MQA),
so every rank computes and stores the full KV of every request: the group's token capacity is one
rank's. What grows with ``n`` is that capacity: each rank's KV budget is its device memory times the
utilization minus its weights, and its weights shrink.

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

from atom.config import CacheConfig, SchedulerConfig
from atom.kv.kv_layout import KvLayout, plan_kv_layout
from atom.models.deepseek_v4.checkpoint import release_format, stored_dtype
from atom.models.deepseek_v4.config import DeepseekV4Config
from atom.models.deepseek_v4.model import DeepseekV4Model
from atom.parallel.shard_plan import ShardPlan
from atom.parallel.sharding import ParameterBytes

__all__ = ["model_weight_bytes", "rank_weight_bytes", "RankCapacity", "rank_capacity", "format_rank_capacity",
           "stored_bytes", "parallel_sizes", "report"]

GIB = 1 << 30
_PER_EXPERT = re.compile(r"\.ffn\.(?:experts\.\d+\.|gate\.(?:weight|bias)$)")  # sized by the expert count
_DEQUANT_ON_LOAD = re.compile(r"attn\.wo_a\.weight$")


def stored_bytes(name: str, shape: tuple[int, ...]) -> int:
    """Bytes tensor ``name`` of logical ``shape`` takes on a GPU rank in the release's formats (scales included)."""
    numel = math.prod(shape)
    fmt = release_format(name, fp8=True, fp4_experts=True)
    if fmt == "mxfp4":
        return numel // 2 + numel // 32
    if fmt == "fp8" and not _DEQUANT_ON_LOAD.search(name):
        return numel + math.ceil(shape[0] / 128) * math.ceil(shape[1] / 128)
    return numel * stored_dtype(name).itemsize


def model_weight_bytes(cfg: DeepseekV4Config) -> ParameterBytes:
    """The whole model's weights in the release formats, split into the tensors ranks split or partition and
    the replicated ones. The model is enumerated on ``meta`` with as few routed experts as it routes to, and
    the tensors sized by the expert count are scaled up to the real count."""
    few = max(cfg.n_activated_experts, 1)
    plan = ShardPlan(0, 1, n_experts=few)
    held = {(sharded, per_expert): 0 for sharded in (True, False) for per_expert in (True, False)}
    for name, t in DeepseekV4Model(cfg.replace(n_routed_experts=few), device="meta").state_dict().items():
        if name.startswith("mtp."):
            continue
        held[plan.is_sharded(name), bool(_PER_EXPERT.search(name))] += stored_bytes(name, tuple(t.shape))
    for sharded in (True, False):  # every expert-sized tensor comes ``few`` times: exact integer scaling
        assert held[sharded, True] % few == 0
        held[sharded, True] = held[sharded, True] // few * cfg.n_routed_experts
    return ParameterBytes(held[True, True] + held[True, False], held[False, True] + held[False, False])


def rank_weight_bytes(whole: ParameterBytes, size: int) -> ParameterBytes:
    """What one of ``size`` ranks holds of a model whose weights are ``whole`` (tensor-parallel attention;
    experts split or partitioned, the same bytes per rank)."""
    return ParameterBytes(-(-whole.sharded // size), whole.replicated)


@dataclass(frozen=True)
class RankCapacity:
    """One group size: a rank's weights, its KV budget and the tokens its arena (= the group) holds."""

    size: int
    weights: ParameterBytes
    kv_budget: int  # <= 0: the weights alone do not fit
    layout: KvLayout | None
    tokens: int


def rank_capacity(cfg: DeepseekV4Config, whole: ParameterBytes, size: int, device_bytes: int, utilization: float,
                  live: int) -> RankCapacity:
    """A rank of ``size`` serving ``cfg`` (weights ``whole``, :func:`model_weight_bytes`) on a device of
    ``device_bytes`` of which ``utilization`` is used, with ``live`` request states held."""
    from atom.bench.capacity import LIVE_MIX, chunked_capacity, state_chunks

    weights = rank_weight_bytes(whole, size)
    budget = int(device_bytes * utilization) - weights.total
    spec = cfg.kv_spec("fp8_ds_mla")
    if budget <= 0:
        return RankCapacity(size, weights, budget, None, 0)
    lay = plan_kv_layout(spec, CacheConfig(kv_cache_bytes=budget),
                         SchedulerConfig(max_num_seqs=live, max_model_len=1 << 20))
    chunks = lay.num_chunks - state_chunks(lay, live)
    tokens = spec.block_size * chunked_capacity(LIVE_MIX, chunks, lay.chunk_pages, lay.compress_pages_per_chunk)
    return RankCapacity(size, weights, budget, lay, tokens)


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
