"""Trace-driven simulation: the elastic arena against fixed splits, an ATOM-style arena and the oracle.

    python -m atom.bench.simulate [--quick] [--geometries flash pro] [--workloads chat long agentic sysprompt mix]
                                  [--budget-gib 40] [--shares 0.05 0.1 0.2 0.3 0.5] [--plot PATH]
                                  [--host-kv-gib N] [--pcie-gbps 50] [--attn-gbps 3000] [--step-ms 5] [--token-us T]
    python -m atom.bench.simulate --replicas D [--router prefix least-loaded round-robin] ...   (sim_replicas)

Every policy runs the real :class:`LLMEngine` (its :class:`Scheduler` + :class:`BlockManager`) with a
:class:`FakeRunner` on the same seeded trace (:mod:`atom.bench.sim_workloads`); only the arena under
the block manager (and the retention flags, through :class:`CacheConfig` fields) differ. One step =
one :meth:`LLMEngine.step_detailed` (one token per decoding request, prefill chunked by the token
budget); a step that schedules nothing is not counted. Modelled time advances by the cost model per step
(:mod:`atom.bench.sim_cost`: a fixed cost, a per-token GEMM cost calibrated against a published V4-Flash
result, attention growing with the KV bytes each token reads, and the host tier's PCIe copies).

Throughput = tokens served (prompt + generated tokens of every finished request) / modelled seconds
from 0 to the last completion. Utilisation at a step = (pages in use, live or cached, x their exact
bytes, all three owners: SWA and compressed blocks and live requests' compressor state) / the KV
budget (the same for every policy); "under memory pressure" = the steps in which the block manager evicted a cached
block or the scheduler preempted a request. Hit rate = reused prompt tokens / prompt tokens, counted
at each request's first admission (``Sequence.stats``); the lost-token columns are ``bm.counters``.

The last line is ``throughput_vs_best_fixed_min=<x> hit_rate_agentic=<y> utilisation_mean=<z>``:
x = min over geometries and workloads of the arena's (default flags) throughput / the best fixed
split's (default flags, best share of the sweep for that workload); y = the arena's (default flags)
hit rate on the agentic workload (min over geometries); z = the time-weighted mean utilisation of
the arena (all three flag settings pooled) over its steps under memory pressure (nan if none).
"""

from __future__ import annotations

import argparse
import heapq
import math
import os.path
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence as Seq

from atom.bench.sim_arenas import (ARENA, ARENA_HOST, ARENA_POLICIES, OTHER_POLICIES, Policy, build_block_manager,
                                   exact_page_bytes, fixed)
from atom.bench.sim_cost import CostModel, StepClock, model_for
from atom.bench.sim_workloads import VOCAB, WORKLOADS, Session, build_trace, finish_turn, pop_arrival, request_id
from atom.config import CacheConfig, Dsv4KvSpec, SchedulerConfig
from atom.testing.fake_runner import FakeRunner
from atom.kv.kv_layout import KvLayout, plan_kv_layout
from atom.kv.prefix_stats import PrefixStats
from atom.model_engine.llm_engine import LLMEngine
from atom.model_engine.router import POLICIES as ROUTER_POLICIES
from atom.model_engine.scheduler import Scheduler
from atom.model_engine.sequence import Sequence
from atom.kv.page_map import COMPRESS, STATE, SWA
from atom.models.deepseek_v4.config import DeepseekV4Config
from atom.sampling_params import SamplingParams

GEOMETRIES = {"flash": "deepseek_v4_flash", "pro": "deepseek_v4_pro"}
MAX_MODEL_LEN = 270336  # 256K prompts + answers


@dataclass(frozen=True)
class SimConfig:
    """Geometry and limits shared by every policy of a run."""

    preset: str = "deepseek_v4_flash"
    budget_bytes: int = 40 * 2**30
    max_num_seqs: int = 256
    max_batched_tokens: int = 8192
    max_model_len: int = MAX_MODEL_LEN
    cost: CostModel | None = None  # None: sim_cost.model_for(preset), the calibrated model
    prefix_caching: bool = True
    host_kv_bytes: int = 0  # the host tier of the ``arena+host`` policy (0: that policy does not run)
    check_every: int = 0  # run the control plane's integrity checks every N steps (0 = never)

    @property
    def limits(self) -> SchedulerConfig:
        return SchedulerConfig(self.max_batched_tokens, self.max_num_seqs, self.max_model_len)


@dataclass
class RunResult:
    """What one (trace, policy) run measured."""

    policy: str
    served_tokens: int = 0
    modelled_s: float = 0.0
    wall_s: float = 0.0
    steps: int = 0
    finished: int = 0
    aborted: int = 0  # aborted by the scheduler, or refused (prompt + answer over max_model_len)
    max_running: int = 0
    mean_running: float = 0.0
    preemptions: int = 0
    hit_tokens: int = 0
    prompt_tokens: int = 0
    hits_by_kind: dict[str, list[int]] = field(default_factory=dict)  # kind -> [reused, prompt]
    counters: PrefixStats = field(default_factory=PrefixStats)  # the block manager's totals
    util_mean: float = 0.0
    util_pressure: float = math.nan  # mean over steps that evicted a cached block or preempted
    pressure_s: float = 0.0
    evictions: int = 0
    speed_model_s: float = 0.0  # modelled seconds of steps with max_num_seqs running
    speed_wall_s: float = 0.0
    series: list[tuple[float, int, int]] = field(default_factory=list)  # (t, swa bytes, compressed bytes)
    host_bytes_in: int = 0  # host tier: bytes loaded (host -> device) and stored (device -> host)
    host_bytes_out: int = 0
    copy_wait_s: float = 0.0  # modelled seconds steps waited for host copies

    @property
    def throughput(self) -> float:
        return self.served_tokens / self.modelled_s if self.modelled_s else 0.0

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    def kind_hit_rate(self, kind: str) -> float:
        reused, prompt = self.hits_by_kind.get(kind, (0, 0))
        return reused / prompt if prompt else 0.0


def load_spec(preset: str) -> Dsv4KvSpec:
    return DeepseekV4Config.from_preset(preset).kv_spec()


def base_layout(cfg: SimConfig) -> KvLayout:
    return plan_kv_layout(load_spec(cfg.preset), CacheConfig(kv_cache_bytes=cfg.budget_bytes), cfg.limits)


def run_trace(sessions: Seq[Session], policy: Policy, cfg: SimConfig, layout: KvLayout | None = None,
              series_points: int = 600) -> RunResult:
    """Run ``sessions`` to completion under ``policy``; deterministic in its inputs.

    A session's next turn is queued ``think_s`` modelled seconds after its previous turn finished,
    with prompt = that turn's final token ids + the new segments. A turn the scheduler aborts ends
    its session.
    """
    layout = layout or base_layout(cfg)
    bm = build_block_manager(policy, layout, cfg)
    engine = LLMEngine(Scheduler(cfg.limits, bm, None), FakeRunner(vocab_size=VOCAB))
    sched = engine.scheduler
    budget, cost = layout.kv_cache_bytes, exact_page_bytes(layout)
    clock = StepClock(cfg.cost or model_for(cfg.preset), cost)
    by_sid = {s.sid: s for s in sessions}
    pending: list[tuple[float, int, int]] = [(s.arrival, request_id(s.sid, 0), s.sid) for s in sessions]
    heapq.heapify(pending)
    live: dict[int, tuple[Sequence, int, int]] = {}  # rid (= seq_id, the engine's request id as text) -> (seq, sid, turn)
    seen: set[int] = set()
    res = RunResult(policy.name)
    t, run_area, util_area, util_pressure_area = 0.0, 0.0, 0.0, 0.0
    raw_series: list[tuple[float, int, int]] = []
    wall0 = time.perf_counter()
    while pending or engine.has_unfinished_requests():
        while pending and pending[0][0] <= t:
            rid, sid, turn_idx, turn, tokens = pop_arrival(pending, by_sid, live)
            if len(tokens) + turn.max_tokens > cfg.max_model_len:
                res.aborted += 1  # the session ends here: its history outgrew the model length
                continue
            seq = Sequence(tokens, SamplingParams(max_tokens=turn.max_tokens, ignore_eos=True),
                           layout.spec.block_size, seq_id=rid, arrival=t)
            engine.add_sequence(seq, str(rid))
            live[rid] = (seq, sid, turn_idx)
        if not engine.has_unfinished_requests():
            t = pending[0][0] if pending else t
            continue
        w0 = time.perf_counter()
        pressure0 = bm.comp.pool.num_evictions + bm.swa.pool.num_evictions + sched.num_preemptions
        step = engine.step_detailed()
        wall_step = time.perf_counter() - w0
        for out in step.outputs:
            if out.finished and out.finish_reason == "abort":  # the scheduler gave up on it: its session ends
                res.aborted += 1
                live.pop(int(out.request_id))
        batch = step.batch
        if not batch.seqs:
            if sched.running or not pending:
                raise RuntimeError(f"{policy.name}: a step scheduled nothing with {len(sched.running)} "
                                   f"running and {len(sched.waiting)} waiting")
            t = max(t, pending[0][0])
            continue
        dt = clock.step(batch)
        running = len(batch.seqs)
        for new in batch.new_tables:
            if new.seq_id not in seen:
                seen.add(new.seq_id)
                seq, sid, _ = live[new.seq_id]
                kind = by_sid[sid].kind
                acc = res.hits_by_kind.setdefault(kind, [0, 0])
                acc[0] += seq.stats.reused
                acc[1] += seq.stats.prompt_tokens
        t += dt
        res.steps += 1
        res.max_running = max(res.max_running, running)
        run_area += running * dt
        used_swa = bm.arena.num_used(SWA) * cost[SWA]
        used_comp = bm.arena.num_used(COMPRESS) * cost[COMPRESS]
        used_state = bm.arena.num_used(STATE) * cost[STATE]
        util = (used_swa + used_comp + used_state) / budget
        util_area += util * dt
        if bm.comp.pool.num_evictions + bm.swa.pool.num_evictions + sched.num_preemptions > pressure0:
            util_pressure_area += util * dt
            res.pressure_s += dt
        if running == cfg.max_num_seqs:
            res.speed_model_s += dt
            res.speed_wall_s += wall_step
        raw_series.append((t, used_swa, used_comp))
        if cfg.check_every and res.steps % cfg.check_every == 0:
            engine.check_integrity()
        for out in step.outputs:
            if not out.finished or out.finish_reason == "abort":
                continue
            res.finished += 1
            res.served_tokens += finish_turn(pending, by_sid, live, int(out.request_id), t)
            res.modelled_s = t
    res.wall_s = time.perf_counter() - wall0
    total_t = max(t, 1e-12)
    res.mean_running = run_area / total_t
    res.util_mean = util_area / total_t
    res.util_pressure = util_pressure_area / res.pressure_s if res.pressure_s else math.nan
    res.preemptions = sched.num_preemptions
    res.hit_tokens = sum(a[0] for a in res.hits_by_kind.values())
    res.prompt_tokens = sum(a[1] for a in res.hits_by_kind.values())
    res.counters = replace(bm.counters)
    res.evictions = bm.comp.pool.num_evictions + bm.swa.pool.num_evictions
    res.host_bytes_in, res.host_bytes_out, res.copy_wait_s = clock.bytes_in, clock.bytes_out, clock.copy_wait_s
    stride = max(1, len(raw_series) // series_points)
    res.series = raw_series[::stride]
    return res


# ---- the comparison run ----------------------------------------------------------------------
@dataclass(frozen=True)
class WorkloadReport:
    """All policies on one (geometry, workload) trace; the fixed split's best shares per flag family."""

    geometry: str
    workload: str
    results: dict[str, RunResult]
    best_share: dict[bool, float]  # retain? -> best SWA share of the sweep
    budget_bytes: int

    def best_fixed(self, retain: bool = False) -> RunResult:
        return self.results[fixed(self.best_share[retain], retain).name]

    def vs_best_fixed(self, name: str) -> float:
        retain = name.endswith(("+retain", "+interval"))
        return self.results[name].throughput / self.best_fixed(retain).throughput


def compare(geometry: str, workload: str, sessions: Seq[Session], cfg: SimConfig, shares: Seq[float],
            log: Callable[[str], None] = print) -> WorkloadReport:
    """Every policy on one trace; the fixed split is swept over ``shares`` with default flags and with
    full retain, and the best share (highest throughput, then the smaller share) is kept for each."""
    layout = base_layout(cfg)
    policies = [*ARENA_POLICIES, *(fixed(s, r) for r in (False, True) for s in shares), *OTHER_POLICIES]
    policies += [ARENA_HOST] if cfg.host_kv_bytes else []
    results = {}
    for i, pol in enumerate(policies):
        r = run_trace(sessions, pol, cfg, layout)
        results[pol.name] = r
        log(f"  [{geometry} {workload}] {i + 1}/{len(policies)} {pol.name}: {r.steps} steps, "
            f"{r.modelled_s:.1f} modelled s in {r.wall_s:.1f} wall s, {r.throughput:,.0f} tok/s")
    best = {r: max(shares, key=lambda s: (results[fixed(s, r).name].throughput, -s)) for r in (False, True)}
    return WorkloadReport(geometry, workload, results, best, layout.kv_cache_bytes)


def _fmt(x: float, spec: str = ".3f") -> str:
    return "n/a" if math.isnan(x) else format(x, spec)


def format_table(rep: WorkloadReport, shares: Seq[float]) -> str:
    sweep = "; ".join(("retain " if r else "default ") + ", ".join(
        f"{s:g}: {rep.results[fixed(s, r).name].throughput:,.0f}" for s in shares) for r in (False, True))
    lines = [f"## {rep.geometry} / {rep.workload} (fixed-split sweep, tok/s: {sweep})",
             "| policy | max run | mean run | tok/s | vs best fixed | preempt | hit rate | lost evicted | "
             "lost SWA | lost CSA | evictions | util mean | util pressure (s) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    names = [p.name for p in ARENA_POLICIES]
    for retain in (False, True):
        names += [fixed(0.1, retain).name, fixed(0.2, retain).name, rep.best_fixed(retain).policy]
    names += [p.name for p in OTHER_POLICIES]
    for name in dict.fromkeys(n for n in names if n in rep.results):
        r, c = rep.results[name], rep.results[name].counters
        best = name in (rep.best_fixed(False).policy, rep.best_fixed(True).policy)
        lines.append(f"| {name}{' (best)' if best else ''} | {r.max_running} | {r.mean_running:.1f} | "
                     f"{r.throughput:,.0f} | {rep.vs_best_fixed(name):.3f} | {r.preemptions} | {r.hit_rate:.3f} | "
                     f"{c.lost_to_evicted_kv:,} | {c.lost_to_swa_window:,} | {c.lost_to_csa_state:,} | {r.evictions:,} | "
                     f"{r.util_mean:.3f} | {_fmt(r.util_pressure)} ({r.pressure_s:.0f}) |")
    return "\n".join(lines)


def plot(reports: list[WorkloadReport], path: str) -> bool:
    """Occupancy per owner over time (mix workload, first geometry) and throughput per policy; False
    (nothing written) when matplotlib is not installed (it comes with the ``bench`` extra)."""
    try:
        import matplotlib
    except ImportError:
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    focus = next((r for r in reports if r.workload == "mix"), reports[0])
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(13, 10))
    shown = ("arena", "arena+retain", focus.best_fixed(True).policy, "oracle+retain")
    for name, style in zip(shown, ("-", "--", ":", "-.")):
        r = focus.results[name]
        ts = [p[0] for p in r.series]
        ax1.plot(ts, [p[1] / 2**30 for p in r.series], style, color="tab:blue", label=f"{name}: SWA")
        ax1.plot(ts, [p[2] / 2**30 for p in r.series], style, color="tab:orange", label=f"{name}: compressed")
    ax1.axhline(focus.budget_bytes / 2**30, color="black", linewidth=0.5, label="KV budget")
    ax1.set_xlabel("modelled seconds")
    ax1.set_ylabel("GiB holding live or cached KV")
    ax1.set_title(f"Occupancy per owner over time: {focus.geometry} / {focus.workload}")
    ax1.legend(fontsize=7, ncol=4)
    names = [n for n in reports[0].results if not n.startswith("fixed-")] + ["best fixed", "best fixed+retain"]
    width = 0.8 / len(names)
    for i, name in enumerate(names):
        vals = [(r.best_fixed(name.endswith("+retain")) if name.startswith("best") else r.results[name]).throughput
                / r.best_fixed(False).throughput for r in reports]
        ax2.bar([k + i * width for k in range(len(reports))], vals, width, label=name)
    ax2.set_xticks([k + 0.4 - width / 2 for k in range(len(reports))])
    ax2.set_xticklabels([f"{r.geometry}\n{r.workload}" for r in reports], fontsize=8)
    ax2.axhline(1.0, color="black", linewidth=0.5)
    ax2.set_ylabel("throughput / best fixed split (default flags)")
    ax2.legend(fontsize=7, ncol=5)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def single_share_table(reports: list[WorkloadReport], shares: Seq[float]) -> str:
    """One fixed share per geometry and flag family for every workload (a deployment cannot re-split
    per workload): the share with the least worst-case regret (throughput / that workload's best
    share), and the arena's throughput against it."""
    lines = ["## One fixed share for all workloads (least worst-case regret over the sweep)",
             "| geometry | flags | share | " + " | ".join(f"arena / fixed on {r.workload}" for r in reports
                                                        if r.geometry == reports[0].geometry) + " |",
             "|---|---|---|" + "---|" * sum(r.geometry == reports[0].geometry for r in reports)]
    for geo in dict.fromkeys(r.geometry for r in reports):
        reps = [r for r in reports if r.geometry == geo]
        for retain, arena in ((False, "arena"), (True, "arena+retain")):
            def regret(s: float) -> float:
                return min(r.results[fixed(s, retain).name].throughput / r.best_fixed(retain).throughput for r in reps)
            share = max(shares, key=lambda s: (regret(s), -s))
            ratios = [r.results[arena].throughput / r.results[fixed(share, retain).name].throughput for r in reps]
            lines.append(f"| {geo} | {'retain' if retain else 'default'} | {share:g} | "
                         + " | ".join(f"{x:.3f}" for x in ratios) + " |")
    return "\n".join(lines)


def host_tier_table(reports: list[WorkloadReport], host_gib: float) -> str:
    """Per workload: ``arena`` (device only) against ``arena+host`` (the same arena over the host tier)."""
    lines = [f"## Host tier ({host_gib:g} GiB host, arena default flags): device only vs with the tier",
             "| geometry / workload | hit rate | hit rate +host | host hit tokens | tok/s | tok/s +host | +host / device "
             "| MiB loaded | MiB stored | copy wait (s) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for rep in reports:
        dev, host = rep.results[ARENA.name], rep.results[ARENA_HOST.name]
        lines.append(f"| {rep.geometry} / {rep.workload} | {dev.hit_rate:.3f} | {host.hit_rate:.3f} | "
                     f"{getattr(host.counters, 'reused_from_host', 0):,} | {dev.throughput:,.0f} | "
                     f"{host.throughput:,.0f} | {host.throughput / dev.throughput:.3f} | "
                     f"{host.host_bytes_in / 2**20:,.0f} | {host.host_bytes_out / 2**20:,.0f} | {host.copy_wait_s:.2f} |")
    return "\n".join(lines)


def host_tier_line(reports: list[WorkloadReport]) -> str:
    """``host_tier: hit_rate_agentic=.. device_only=.. tokens_per_s_vs_device_only_min=..``: the agentic hit
    rate of ``arena+host`` and of ``arena`` (min over geometries), and the least tok/s ratio of the two."""
    def agentic(name: str) -> float:
        return min((rep.results[name].kind_hit_rate("agentic") for rep in reports if rep.workload == "agentic"),
                   default=math.nan)
    ratio = min(rep.results[ARENA_HOST.name].throughput / rep.results[ARENA.name].throughput for rep in reports)
    return (f"host_tier: hit_rate_agentic={agentic(ARENA_HOST.name):.4f} device_only={agentic(ARENA.name):.4f} "
            f"tokens_per_s_vs_device_only_min={ratio:.4f}")


def summary_line(reports: list[WorkloadReport]) -> str:
    """``throughput_vs_best_fixed_min=.. hit_rate_agentic=.. utilisation_mean=..`` (see the module doc)."""
    ratios = [rep.vs_best_fixed("arena") for rep in reports]
    agentic = [rep.results["arena"].kind_hit_rate("agentic") for rep in reports if rep.workload == "agentic"]
    agentic = agentic or [rep.results["arena"].kind_hit_rate("agentic") for rep in reports
                          if "agentic" in rep.results["arena"].hits_by_kind]
    press = [rep.results[p.name] for rep in reports for p in ARENA_POLICIES]
    secs = sum(r.pressure_s for r in press)
    util = sum(r.util_pressure * r.pressure_s for r in press if r.pressure_s) / secs if secs else math.nan
    return (f"throughput_vs_best_fixed_min={min(ratios):.4f} hit_rate_agentic={min(agentic, default=math.nan):.4f} "
            f"utilisation_mean={util:.4f}")


def _number(kind: type, upper: float | None = None, allow_zero: bool = False) -> Callable[[str], float]:
    """An argparse type: a ``kind`` value > 0 (>= 0 with ``allow_zero``) and < ``upper`` if given."""
    def parse(text: str) -> float:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
        if not (value >= 0 if allow_zero else value > 0) or (upper is not None and not value < upper):
            raise argparse.ArgumentTypeError(f"{text!r} must be {'>= 0' if allow_zero else '> 0'}"
                                             + (f" and < {upper}" if upper else ""))
        return value
    return parse


def main(argv: Seq[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m atom.bench.simulate", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small smoke run (flash, scale 0.08, shares 0.1 0.2)")
    ap.add_argument("--geometries", nargs="+", choices=sorted(GEOMETRIES), default=None)
    ap.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=None)
    ap.add_argument("--scale", type=_number(float), default=None, help="x the default session counts (1)")
    ap.add_argument("--rate-scale", type=_number(float), default=1.0, help="x the default arrival rates (1)")
    ap.add_argument("--seed", type=_number(int, None, allow_zero=True), default=0, help="trace seed (>= 0)")
    ap.add_argument("--budget-gib", type=_number(float), default=40.0, help="KV budget per GPU (default 40)")
    ap.add_argument("--max-num-seqs", type=_number(int), default=256)
    ap.add_argument("--max-batched-tokens", type=_number(int), default=8192)
    ap.add_argument("--shares", type=_number(float, 1.0), nargs="+", default=None,
                    help="SWA byte shares swept for the fixed split (default 0.05 0.1 0.2 0.3 0.5)")
    ap.add_argument("--step-ms", type=_number(float), default=5.0, help="modelled fixed cost per step (5)")
    ap.add_argument("--token-us", type=_number(float), default=None,
                    help="modelled GEMM cost per token (default: calibrated, docs/simulation.md)")
    ap.add_argument("--attn-gbps", type=_number(float), default=3000.0,
                    help="GB/s at which attention reads KV bytes (3000)")
    ap.add_argument("--pcie-gbps", type=_number(float), default=50.0, help="host tier copies, GB/s each way (50)")
    ap.add_argument("--host-kv-gib", type=_number(float, None, allow_zero=True), default=0.0,
                    help="host tier under the arena: adds the arena+host policy (default 0: off)")
    ap.add_argument("--plot", default=None, help="PNG path (default: <tmpdir>/atom_simulate.png)")
    ap.add_argument("--replicas", type=_number(int), default=None,
                    help="data-parallel attention: this many arenas of budget/D behind the replica router, "
                         "instead of the arena comparison (atom/bench/sim_replicas.py)")
    ap.add_argument("--router", nargs="+", choices=ROUTER_POLICIES, default=None,
                    help="with --replicas: the router policies compared (default: all three; the last line "
                         "reports the first)")
    args = ap.parse_args(argv)
    if args.router and not args.replicas:
        ap.error("--router needs --replicas")
    geometries = args.geometries or (["flash"] if args.quick else ["flash", "pro"])
    workloads = args.workloads or list(WORKLOADS)
    scale = args.scale or (0.08 if args.quick else 1.0)
    shares = sorted(set(args.shares or ((0.1, 0.2) if args.quick else (0.05, 0.1, 0.2, 0.3, 0.5))))
    plot_path = args.plot or os.path.join(tempfile.gettempdir(), "atom_simulate.png")
    costs = {geo: model_for(GEOMETRIES[geo], step_s=args.step_ms / 1e3,
                            token_s=None if args.token_us is None else args.token_us / 1e6,
                            attn_bytes_per_s=args.attn_gbps * 1e9, pcie_bytes_per_s=args.pcie_gbps * 1e9)
             for geo in geometries}
    if args.replicas:
        from atom.bench.sim_replicas import replica_main
        return replica_main(ap, args, geometries, workloads, scale, costs)
    wall0 = time.perf_counter()
    log: Callable[[str], None] = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    reports = []
    for geo in geometries:
        cfg = SimConfig(GEOMETRIES[geo], int(args.budget_gib * 2**30), args.max_num_seqs,
                        args.max_batched_tokens, cost=costs[geo], host_kv_bytes=int(args.host_kv_gib * 2**30))
        try:
            base_layout(cfg)
        except ValueError as e:
            ap.error(f"--budget-gib {args.budget_gib} with {geo}: {e}")
        for wl in workloads:
            sessions = build_trace(wl, scale, args.seed, args.rate_scale)
            log(f"[{time.perf_counter() - wall0:6.1f}s] {geo} {wl}: {len(sessions)} sessions")
            rep = compare(geo, wl, sessions, cfg, shares, log)
            reports.append(rep)
            print(format_table(rep, shares) + "\n", flush=True)
    print(single_share_table(reports, shares) + "\n")
    if args.host_kv_gib:
        print(host_tier_table(reports, args.host_kv_gib) + "\n")
    plotted = plot(reports, plot_path)
    speed_m = sum(r.speed_model_s for rep in reports for r in rep.results.values())
    speed_w = sum(r.speed_wall_s for rep in reports for r in rep.results.values())
    speed = f"{speed_m / speed_w:.1f}" if speed_w else f"n/a (no step ran {args.max_num_seqs} requests)"
    print(f"plot: {plot_path}" if plotted else "plot: skipped (matplotlib is not installed: pip install -e .[bench])")
    print(f"simulator speed at {args.max_num_seqs} running requests: {speed} modelled s per wall s "
          f"({speed_m:.1f} modelled s in {speed_w:.1f} wall s); whole run {time.perf_counter() - wall0:.1f} wall s")
    if args.host_kv_gib:
        print(host_tier_line(reports))
    print(summary_line(reports))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
