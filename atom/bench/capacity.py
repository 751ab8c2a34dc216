"""Capacity report: how many tokens of KV a byte budget holds, per SWA:compressed demand mix.

    python -m atom.bench.capacity [--budget-gib 40] [--max-live-requests 64] [--layout] [--device-gib 80]
                                  [--memory-utilization 0.9]

For each real DeepSeek-V4 geometry (Flash / Pro, fp8_ds_mla and bf16 rows) and each demand mix
``f`` = share of SWA blocks among the blocks a workload holds (0%, 10%, ... 100%), it prints the
usable capacity in tokens (blocks x block_size) of four designs, all given the same budget with
``--max-live-requests`` requests live, whose compressor state counts as used:

- ``arena``: this project's elastic arena (chunks span all layers; m SWA pages or k compressed
  pages per chunk; padding and chunk granularity counted). The live requests' state takes
  ``ceil(live / s)`` chunks of the state owner (``s`` state pages per chunk); the rest holds KV.
- ``fixed``: two fixed pools (SWA / compressed) split at the single byte ratio that is best for the
  whole sweep (maximises its worst capacity / oracle); exact block sizes, no padding.
- ``atom``: an ATOM-style arena: per-layer slices with one uniform chunk count for every ratio group,
  each chunk sized for an SWA block (c4 layers: SWA block + fused CSA state, rounded up to whole
  compressed pages as ATOM did); a compressed block needs a page in every compressed group, so the
  c4 group's pages per chunk bound it. Indexer keys are budgeted inside the c4 page (ATOM left them
  out of its budget, which flattered it).
- ``oracle``: budget / exact bytes per block at that mix (perfect flexibility, no padding).

The fixed split, ATOM-style arena and oracle get the budget minus the live requests' exact state.

A second table per geometry (``live requests``) shows what moving the state into the arena buys:
for 1, 16 and 256 live requests, the arena's KV tokens at a 50% SWA share with the state taken as
pages (what is live), against the same arena with the reservation this engine made before
(``max_num_seqs`` = 256 request states taken off the budget up front, each with the HCA state as a
``ratio``-row kv + score ring: :func:`ring_state_bytes`).

Each geometry's header also gives the exact KV bytes of one 1M-token request
(:mod:`atom.bench.kv_accounting`: what the model must keep, no paging).

Then, per model, what one rank holds under tensor parallelism (:mod:`atom.bench.parallel_capacity`):
its weights, its KV budget on a ``--device-gib`` device at ``--memory-utilization``, and the KV tokens
its arena holds, which is the group's capacity (the latent KV is one head, replicated on every rank).
Then the same under data-parallel attention with expert parallelism, on 80 and 141 GiB devices at 8
and 16 ranks: every layout of ``D`` replicas x ``T`` ranks (TP ``T`` inside a replica, experts over
all ranks), its weights per rank (experts + the replica-split attention, embedding, head and shared
expert, which every replica holds in full + what every rank holds), the KV tokens per replica and of
the group (``D`` x a replica's), against tensor parallelism on the same ranks, and the line
``dp_kv_vs_tp flash_8=<x> pro_16=<y>``: the group's KV tokens with one rank per replica over TP's, 141
GiB devices at 0.9 utilization (:func:`atom.bench.parallel_capacity.dp_report`).

The last line is ``capacity_vs_oracle_min=<x> vs_atom_style_min=<y> vs_fixed_split_min=<z>``: the
minimum over every geometry and mix of the arena's capacity divided by each other design's.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Callable, Sequence

from atom.bench.kv_accounting import request_kv_bytes
from atom.config import CacheConfig, Dsv4KvSpec, SchedulerConfig
from atom.kv_group import is_csa
from atom.models.deepseek_v4.config import DeepseekV4Config
from atom.kv.kv_layout import KvLayout, plan_kv_layout

MIXES = tuple(i / 10 for i in range(11))
GEOMETRIES = (("deepseek_v4_flash", "fp8_ds_mla"), ("deepseek_v4_pro", "fp8_ds_mla"),
              ("deepseek_v4_flash", "bf16"), ("deepseek_v4_pro", "bf16"))
LIVE_REQUESTS = (1, 16, 256)
RESERVED_SEQS = 256  # the max_num_seqs whose state the engine used to reserve up front
LIVE_MIX = 0.5  # the SWA share at which the live-requests table counts tokens


def max_blocks(fits: Callable[[int], bool], upper: int) -> int:
    """Largest N in [0, upper] with ``fits(N)`` (``fits`` is monotone)."""
    lo, hi = 0, upper
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo


def _split(n: int, f: float) -> tuple[int, int]:
    swa = round(n * f)
    return swa, n - swa


def chunked_capacity(f: float, chunks: int, swa_per_chunk: int, comp_per_chunk: int) -> int:
    """Blocks (SWA + compressed, in ratio f) that ``chunks`` chunks hold."""
    def fits(n: int) -> bool:
        s, c = _split(n, f)
        need = -(-s // swa_per_chunk) + (-(-c // comp_per_chunk) if c else 0)
        return need <= chunks
    return max_blocks(fits, chunks * max(swa_per_chunk, comp_per_chunk))


def fixed_capacity(f: float, budget: int, swa_bytes: int, comp_bytes: int, swa_share: float) -> int:
    swa_pool = int(budget * swa_share) // swa_bytes
    comp_pool = int(budget * (1 - swa_share)) // comp_bytes

    def fits(n: int) -> bool:
        s, c = _split(n, f)
        return s <= swa_pool and c <= comp_pool
    return max_blocks(fits, swa_pool + comp_pool)


def oracle_capacity(f: float, budget: int, swa_bytes: int, comp_bytes: int) -> float:
    return budget / (f * swa_bytes + (1 - f) * comp_bytes)


def atom_style_chunks(spec: Dsv4KvSpec, budget: int) -> tuple[int, int]:
    """(uniform chunk count, compressed pages per chunk) of an ATOM-style per-group arena."""
    b, r, ri = spec.block_size, spec.main_row_bytes, spec.index_row_bytes
    chunk_set, pages = 0, []
    for layer, ratio in enumerate(spec.compress_ratios):
        chunk = b * r
        if layer in spec.csa_layers:
            # ATOM rounds the fused c4 chunk (SWA block + CSA state) up to whole compressed pages
            page = spec.entries_per_block(layer) * (r + ri)
            chunk = -(-(chunk + spec.csa_state_bytes) // page) * page
            pages.append(chunk // page)
        elif ratio:
            pages.append(chunk // (spec.entries_per_block(layer) * r))
        chunk_set += chunk
    return budget // chunk_set, min(pages)


def ring_state_bytes(spec: Dsv4KvSpec) -> int:
    """Per-request compressor state as this engine kept it before the HCA accumulator: the CSA rings
    plus, per HCA layer, a ``ratio``-row fp32 kv + score ring (11.6 MiB on V4-Flash, 17.8 MiB on V4-Pro)."""
    total = 0
    for layer in spec.compressed_layers:
        ratio = spec.compress_ratios[layer]
        total += spec.compressor_state_bytes(layer) if is_csa(ratio) else 2 * ratio * spec.head_dim * 4
    return total


def state_chunks(layout: KvLayout, live: int) -> int:
    """Chunks the state owner holds for ``live`` requests (whole request-state pages per chunk)."""
    s = layout.state_pages_per_chunk
    return -(-live // s) if s else 0


@dataclass(frozen=True)
class LiveRow:
    """Arena KV tokens (at :data:`LIVE_MIX`) with ``live`` requests: state as pages vs the old reservation."""

    live: int
    state_bytes: int  # chunks the state owner holds
    reserved_bytes: int  # what the old design took off the budget, whatever ran
    tokens_now: int
    tokens_before: int


def live_request_rows(layout: KvLayout) -> tuple[LiveRow, ...]:
    spec, m, k, b = layout.spec, layout.chunk_pages, layout.compress_pages_per_chunk, layout.spec.block_size
    reserved = RESERVED_SEQS * ring_state_bytes(spec)
    before = b * chunked_capacity(LIVE_MIX, (layout.kv_cache_bytes - reserved) // layout.chunk_bytes, m, k)
    return tuple(LiveRow(n, state_chunks(layout, n) * layout.chunk_bytes, reserved,
                         b * chunked_capacity(LIVE_MIX, layout.num_chunks - state_chunks(layout, n), m, k), before)
                 for n in LIVE_REQUESTS)


@dataclass(frozen=True)
class GeometryReport:
    name: str
    layout: KvLayout
    fixed_share: float
    rows: tuple[tuple[float, int, int, int, float], ...]  # (mix, arena, fixed, atom, oracle) in tokens
    live_rows: tuple[LiveRow, ...]


def best_fixed_share(budget: int, spec: Dsv4KvSpec, mixes: Sequence[float]) -> float:
    """The SWA byte share that maximises the fixed split's worst capacity / oracle over ``mixes``."""
    swa, comp = spec.swa_block_bytes, spec.compressed_block_bytes

    def worst(share: float) -> float:
        return min(fixed_capacity(f, budget, swa, comp, share) / oracle_capacity(f, budget, swa, comp)
                   for f in mixes)
    return max((i / 200 for i in range(1, 200)), key=worst)


def report_geometry(preset: str, row_format: str, budget_bytes: int, max_live: int) -> GeometryReport:
    spec = DeepseekV4Config.from_preset(preset).kv_spec(row_format)
    layout = plan_kv_layout(spec, CacheConfig(kv_cache_bytes=budget_bytes),
                            SchedulerConfig(max_num_seqs=max_live, max_model_len=1 << 20))
    usable = budget_bytes - max_live * spec.request_state_bytes
    kv_chunks = layout.num_chunks - state_chunks(layout, max_live)
    swa, comp, b = spec.swa_block_bytes, spec.compressed_block_bytes, spec.block_size
    share = best_fixed_share(usable, spec, MIXES)
    atom_chunks, atom_k = atom_style_chunks(spec, usable)
    rows = tuple(
        (f,
         b * chunked_capacity(f, kv_chunks, layout.chunk_pages, layout.compress_pages_per_chunk),
         b * fixed_capacity(f, usable, swa, comp, share),
         b * chunked_capacity(f, atom_chunks, 1, atom_k),
         b * oracle_capacity(f, usable, swa, comp))
        for f in MIXES)
    return GeometryReport(f"{preset} {row_format}", layout, share, rows, live_request_rows(layout))


def format_report(rep: GeometryReport) -> str:
    lay = rep.layout
    lines = [
        f"## {rep.name}: chunk = {lay.chunk_pages} SWA pages ({lay.chunk_bytes} B) or "
        f"{lay.compress_pages_per_chunk} compressed pages; {lay.num_chunks} chunks; "
        f"{lay.state_pages_per_chunk} request states of {lay.spec.request_state_bytes / 2**20:.2f} MiB; "
        f"packing swa {lay.swa_packing:.4f} compressed {lay.compressed_packing:.4f} state {lay.state_packing:.4f}; "
        f"budget remainder {lay.budget_remainder:.5f}; fixed split SWA share {rep.fixed_share:.3f}",
        f"exact KV of one 1M-token request (kv_accounting): {request_kv_bytes(lay.spec, 1 << 20) / 2**30:.2f} GiB "
        f"(compressed rows, indexer keys, window) + {lay.spec.request_state_bytes / 2**20:.2f} MiB live "
        "compressor state",
        "| SWA share | arena tokens | fixed split | ATOM-style | oracle | arena/oracle | arena/ATOM | arena/fixed |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for f, arena, fixed, atom, oracle in rep.rows:
        lines.append(f"| {f:.0%} | {arena:,} | {fixed:,} | {atom:,} | {oracle:,.0f} | "
                     f"{arena / oracle:.4f} | {arena / atom:.3f} | {arena / fixed:.3f} |")
    lines += ["", f"live requests (arena KV tokens at {LIVE_MIX:.0%} SWA share; before = {RESERVED_SEQS} request "
                  f"states of {ring_state_bytes(lay.spec) / 2**20:.1f} MiB reserved up front):",
              "| live requests | state in the arena | reserved before | KV tokens now | KV tokens before | now/before |",
              "|---|---|---|---|---|---|"]
    for r in rep.live_rows:
        lines.append(f"| {r.live} | {r.state_bytes / 2**20:,.1f} MiB | {r.reserved_bytes / 2**30:.2f} GiB | "
                     f"{r.tokens_now:,} | {r.tokens_before:,} | {r.tokens_now / r.tokens_before:.3f} |")
    return "\n".join(lines)


def format_layout(lay: KvLayout) -> str:
    """Byte offsets of the fused SWA page and the compressed chunk (for CSA_SWA_FUSION_PLAN.md)."""
    spec = lay.spec
    out = [f"swa_page_bytes={lay.swa_page_bytes} (exact {spec.swa_block_bytes}) chunk_bytes={lay.chunk_bytes} "
           f"row_bytes={spec.main_row_bytes} index_row_bytes={spec.index_row_bytes} "
           f"row_stride={lay.swa_rows(0).page_rows} block_size={spec.block_size}"]
    for layer in spec.csa_layers[:2]:
        st = lay.csa_state(layer)
        parts = ", ".join(f"{k}@+{o} [4x{w}] fp32" for k, (o, w) in st.parts.items())
        out.append(f"c4 layer {layer}: SWA rows @ {lay.swa_rows(layer).offset}, csa_state_off {st.offset} ({parts}); "
                   f"compressed rows @ {lay.compressed_rows(layer).offset}, index rows @ {lay.index_rows(layer).offset}")
    for layer in spec.hca_layers[:1]:
        out.append(f"hca layer {layer}: SWA rows @ {lay.swa_rows(layer).offset}, compressed rows @ "
                   f"{lay.compressed_rows(layer).offset}")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m atom.bench.capacity", description=__doc__.split("\n\n")[0])
    ap.add_argument("--budget-gib", type=float, default=40.0, help="KV memory budget in GiB (default 40)")
    ap.add_argument("--max-live-requests", type=int, default=64,
                    help="live requests whose compressor state counts as used in the mix table (default 64)")
    ap.add_argument("--layout", action="store_true", help="also print the byte offsets of each layout")
    ap.add_argument("--device-gib", type=float, default=80.0,
                    help="device memory of one rank for the per-rank table under tensor parallelism (default 80)")
    ap.add_argument("--memory-utilization", type=float, default=0.9,
                    help="share of the device memory a rank uses for weights and KV (default 0.9)")
    args = ap.parse_args(argv)
    if args.budget_gib <= 0:
        ap.error(f"--budget-gib must be > 0, got {args.budget_gib}")
    if args.max_live_requests < 1:
        ap.error(f"--max-live-requests must be >= 1, got {args.max_live_requests}")
    if args.device_gib <= 0 or not 0 < args.memory_utilization <= 1:
        ap.error(f"--device-gib must be > 0 and --memory-utilization in (0, 1], got {args.device_gib} and "
                 f"{args.memory_utilization}")
    budget = int(args.budget_gib * 2**30)
    ratios = {"oracle": [], "atom": [], "fixed": []}
    for preset, fmt in GEOMETRIES:
        rep = report_geometry(preset, fmt, budget, args.max_live_requests)
        print(format_report(rep), flush=True)
        if args.layout:
            print(format_layout(rep.layout))
        print()
        for _, arena, fixed, atom, oracle in rep.rows:
            ratios["oracle"].append(arena / oracle)
            ratios["atom"].append(arena / atom)
            ratios["fixed"].append(arena / fixed)
    from atom.bench import parallel_capacity

    presets = tuple(dict.fromkeys(preset for preset, _ in GEOMETRIES))
    print(parallel_capacity.report(presets, args.device_gib, args.memory_utilization, args.max_live_requests))
    print()
    print(parallel_capacity.dp_report(presets, args.memory_utilization, args.max_live_requests))
    print()
    print(f"capacity_vs_oracle_min={min(ratios['oracle']):.4f} vs_atom_style_min={min(ratios['atom']):.4f} "
          f"vs_fixed_split_min={min(ratios['fixed']):.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
