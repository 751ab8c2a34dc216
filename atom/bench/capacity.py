"""Capacity report: how many tokens of KV a byte budget holds, per SWA:compressed demand mix.

    python -m atom.bench.capacity [--budget-gib 40] [--max-live-requests 64] [--layout]

For each real DeepSeek-V4 geometry (Flash / Pro, fp8_ds_mla and bf16 rows) and each demand mix
``f`` = share of SWA blocks among the blocks a workload holds (0%, 10%, ... 100%), it prints the
usable capacity in tokens (blocks x block_size) of four designs, all given the same bytes (the
budget minus the live compressor-state pool):

- ``arena``: this project's elastic arena (chunks span all layers; m SWA pages or k compressed
  pages per chunk; padding and chunk granularity counted).
- ``fixed``: two fixed pools (SWA / compressed) split at the single byte ratio that is best for the
  whole sweep (maximises its worst capacity / oracle); exact block sizes, no padding.
- ``atom``: an ATOM-style arena: per-layer slices with one uniform chunk count for every ratio group,
  each chunk sized for an SWA block (c4 layers: SWA block + fused CSA state, rounded up to whole
  compressed pages as ATOM did); a compressed block needs a page in every compressed group, so the
  c4 group's pages per chunk bound it. Indexer keys are budgeted inside the c4 page (ATOM left them
  out of its budget, which flattered it).
- ``oracle``: budget / exact bytes per block at that mix (perfect flexibility, no padding).

The last line is ``capacity_vs_oracle_min=<x> vs_atom_style_min=<y> vs_fixed_split_min=<z>``: the
minimum over every geometry and mix of the arena's capacity divided by each other design's.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Callable, Sequence

from atom.config import CacheConfig, Dsv4KvSpec, SchedulerConfig
from atom.models.deepseek_v4.config import DeepseekV4Config
from atom.model_engine.kv_layout import KvLayout, plan_kv_layout

MIXES = tuple(i / 10 for i in range(11))
GEOMETRIES = (("deepseek_v4_flash", "fp8_ds_mla"), ("deepseek_v4_pro", "fp8_ds_mla"),
              ("deepseek_v4_flash", "bf16"), ("deepseek_v4_pro", "bf16"))


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


@dataclass(frozen=True)
class GeometryReport:
    name: str
    layout: KvLayout
    fixed_share: float
    rows: tuple[tuple[float, int, int, int, float], ...]  # (mix, arena, fixed, atom, oracle) in tokens


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
    usable = budget_bytes - layout.state_pool_bytes
    swa, comp, b = spec.swa_block_bytes, spec.compressed_block_bytes, spec.block_size
    share = best_fixed_share(usable, spec, MIXES)
    atom_chunks, atom_k = atom_style_chunks(spec, usable)
    rows = tuple(
        (f,
         b * chunked_capacity(f, layout.num_chunks, layout.chunk_pages, layout.compress_pages_per_chunk),
         b * fixed_capacity(f, usable, swa, comp, share),
         b * chunked_capacity(f, atom_chunks, 1, atom_k),
         b * oracle_capacity(f, usable, swa, comp))
        for f in MIXES)
    return GeometryReport(f"{preset} {row_format}", layout, share, rows)


def format_report(rep: GeometryReport) -> str:
    lay = rep.layout
    lines = [
        f"## {rep.name}: chunk = {lay.chunk_pages} SWA pages ({lay.chunk_bytes} B) or "
        f"{lay.compress_pages_per_chunk} compressed pages; {lay.num_chunks} chunks; "
        f"packing swa {lay.swa_packing:.4f} compressed {lay.compressed_packing:.4f}; "
        f"budget remainder {lay.budget_remainder:.5f}; fixed split SWA share {rep.fixed_share:.3f}",
        "| SWA share | arena tokens | fixed split | ATOM-style | oracle | arena/oracle | arena/ATOM | arena/fixed |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for f, arena, fixed, atom, oracle in rep.rows:
        lines.append(f"| {f:.0%} | {arena:,} | {fixed:,} | {atom:,} | {oracle:,.0f} | "
                     f"{arena / oracle:.4f} | {arena / atom:.3f} | {arena / fixed:.3f} |")
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
                    help="live compressor-state slots taken off the budget first (default 64)")
    ap.add_argument("--layout", action="store_true", help="also print the byte offsets of each layout")
    args = ap.parse_args(argv)
    if args.budget_gib <= 0:
        ap.error(f"--budget-gib must be > 0, got {args.budget_gib}")
    if args.max_live_requests < 1:
        ap.error(f"--max-live-requests must be >= 1, got {args.max_live_requests}")
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
    print(f"capacity_vs_oracle_min={min(ratios['oracle']):.4f} vs_atom_style_min={min(ratios['atom']):.4f} "
          f"vs_fixed_split_min={min(ratios['fixed']):.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
