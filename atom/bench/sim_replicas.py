"""Trace simulation of data-parallel attention: ``D`` replicas behind the replica router.

    python -m atom.bench.simulate --replicas D [--router prefix least-loaded round-robin] [--workloads ...]

Each replica is the real control plane of one attention replica: its own :class:`LLMEngine` over its
own :class:`Scheduler` and :class:`BlockManager` (the elastic arena, default flags) with a
:class:`FakeRunner`, and ``1/D`` of the KV budget, so the ``D`` arenas together hold the bytes of the
one arena a tensor-parallel group has (whose every rank stores the same KV). The scheduler limits
(``max_num_seqs``, the token budget per step) are per replica, as each replica schedules its own steps.

A request is routed when it arrives by the real :class:`ReplicaRouter` (asking each replica's
:class:`SchedulerView`: its cached prefix of the prompt, free arena, waiting tokens), with the trace's
session id as the session, so under the ``prefix`` policy a session's later turns go back to the
replica that served its first. Replicas step in lockstep (the expert collectives need every rank each
step): a step's modelled time is the longest replica step, each replica's timed by its own
:class:`~atom.bench.sim_cost.StepClock` as ``simulate`` times the single arena's; a replica with
nothing to run meanwhile runs a padding step (counted, not timed: it is never the longest).

Reported per router (and for the single arena of the whole budget, ``simulate``'s ``arena`` policy):
hit rate (reused / prompt tokens at each request's first admission), tokens/s (tokens served /
modelled seconds to the last completion), and the imbalance of the running tokens (a replica's in
a step: the context its scheduled requests reach, i.e. the KV its attention reads and holds for
them): each replica's time-averaged over the steps, max over replicas / mean over replicas; and
the step imbalance, the time-weighted mean over steps of that ratio per step.
"""

from __future__ import annotations

import argparse
import heapq
import math
import sys
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence as Seq

from atom.bench.sim_arenas import ARENA, build_block_manager, exact_page_bytes
from atom.bench.sim_cost import CostModel, StepClock, model_for
from atom.bench.sim_workloads import VOCAB, Session, Turn, build_trace, finish_turn, pop_arrival, request_id
from atom.bench.simulate import GEOMETRIES, RunResult, SimConfig, base_layout, run_trace
from atom.model_engine.llm_engine import LLMEngine
from atom.model_engine.router import POLICIES, ReplicaRouter, SchedulerView
from atom.model_engine.scheduler import Scheduler
from atom.model_engine.sequence import Sequence
from atom.sampling_params import SamplingParams
from atom.testing.fake_runner import FakeRunner

__all__ = ["ReplicaRunResult", "run_replicas", "replica_config", "ReplicaReport", "compare_routers",
           "format_replica_table", "replica_summary_line", "replica_main"]


@dataclass
class ReplicaRunResult(RunResult):
    """A :class:`RunResult` of ``replicas`` arenas behind one router, with the balance it reached."""

    replicas: int = 1
    routed: list[int] = field(default_factory=list)  # requests routed to each replica
    split_sessions: int = 0  # sessions whose turns ran on more than one replica
    padding_steps: int = 0  # replica-steps that ran no batch while another replica ran one
    imbalance: float = math.nan  # max / mean over replicas of the time-averaged running tokens
    step_imbalance: float = math.nan  # time-weighted mean over steps of max / mean running tokens


def replica_config(cfg: SimConfig, replicas: int) -> SimConfig:
    """One replica's share of ``cfg``: ``1/replicas`` of the KV budget, the same scheduler limits."""
    if replicas < 1:
        raise ValueError(f"replicas must be >= 1, got {replicas}")
    return replace(cfg, budget_bytes=cfg.budget_bytes // replicas)


class _Replicas:
    """``D`` engines and the router in front of them, with what the run accumulates."""

    def __init__(self, cfg: SimConfig, replicas: int, policy: str) -> None:
        part = replica_config(cfg, replicas)
        layout = base_layout(part)
        self.block_size = layout.spec.block_size
        self.engines = [LLMEngine(Scheduler(part.limits, build_block_manager(ARENA, layout, part), None),
                                  FakeRunner(vocab_size=VOCAB)) for _ in range(replicas)]
        self.views = [SchedulerView(e.scheduler) for e in self.engines]
        cost = cfg.cost or model_for(cfg.preset)
        self.clocks = [StepClock(cost, exact_page_bytes(layout)) for _ in range(replicas)]  # one per replica
        self.router = ReplicaRouter(policy)
        self.res = ReplicaRunResult(policy, replicas=replicas, routed=[0] * replicas)
        self.token_area = [0.0] * replicas  # running tokens x seconds, per replica
        self.placed: dict[int, set[int]] = {}  # session -> the replicas its turns went to

    def busy(self) -> bool:
        return any(e.has_unfinished_requests() for e in self.engines)

    def add(self, tokens: list[int], turn: Turn, rid: int, sid: int, t: float) -> tuple[Sequence, int]:
        d = self.router.route(tokens, self.views, session=str(sid))
        seq = Sequence(tokens, SamplingParams(max_tokens=turn.max_tokens, ignore_eos=True), self.block_size,
                       seq_id=rid, arrival=t)
        self.engines[d].add_sequence(seq, str(rid))
        self.res.routed[d] += 1
        self.placed.setdefault(sid, set()).add(d)
        return seq, d


def run_replicas(sessions: Seq[Session], cfg: SimConfig, replicas: int, policy: str = "prefix") -> ReplicaRunResult:
    """Run ``sessions`` to completion on ``replicas`` arenas of ``cfg.budget_bytes / replicas`` each
    behind a :class:`ReplicaRouter` of ``policy``; deterministic in its inputs. A session's next
    turn arrives ``think_s`` after its previous turn finished (as in :func:`run_trace`); a turn the
    scheduler aborts, or whose history outgrew the model length, ends its session."""
    group = _Replicas(cfg, replicas, policy)
    res, by_sid = group.res, {s.sid: s for s in sessions}
    pending: list[tuple[float, int, int]] = [(s.arrival, request_id(s.sid, 0), s.sid) for s in sessions]
    heapq.heapify(pending)
    live: dict[int, tuple[Sequence, int, int]] = {}  # rid -> (seq, sid, turn index)
    seen: set[int] = set()
    t = stepped_s = step_ratio_area = 0.0
    wall0 = time.perf_counter()
    while pending or group.busy():
        while pending and pending[0][0] <= t:
            rid, sid, turn_idx, turn, tokens = pop_arrival(pending, by_sid, live)
            if len(tokens) + turn.max_tokens > cfg.max_model_len:
                res.aborted += 1
                continue
            live[rid] = (group.add(tokens, turn, rid, sid, t)[0], sid, turn_idx)
        if not group.busy():
            t = pending[0][0] if pending else t
            continue
        step_s, finished, tokens = _lockstep(group, live, seen, by_sid)
        if step_s is None:  # no replica scheduled anything: only arrivals can change that
            if any(e.scheduler.running for e in group.engines) or not pending:
                raise RuntimeError(f"{policy}: no replica scheduled anything with requests still queued")
            t = max(t, pending[0][0])
            continue
        t += step_s
        res.steps += 1
        stepped_s += step_s
        for d, n in enumerate(tokens):
            group.token_area[d] += n * step_s
        step_ratio_area += max(tokens) / (sum(tokens) / replicas) * step_s  # some replica ran: the mean is > 0
        res.max_running = max(res.max_running, sum(len(e.scheduler.running) for e in group.engines))
        for rid in finished:
            res.finished += 1
            res.served_tokens += finish_turn(pending, by_sid, live, rid, t)
            res.modelled_s = t
    res.step_imbalance = step_ratio_area / stepped_s if stepped_s else math.nan
    return _finish(group, time.perf_counter() - wall0)


def _lockstep(group: _Replicas, live: dict[int, tuple[Sequence, int, int]], seen: set[int],
              by_sid: dict[int, Session]) -> tuple[float | None, list[int], list[int]]:
    """One step of every replica with work; (the longest replica step's seconds or None if no replica
    scheduled anything, the ids of the requests that finished, each replica's running tokens: the
    context its scheduled requests reach in the step)."""
    res, longest, finished, idle = group.res, None, [], 0
    running = [0] * len(group.engines)
    for d, (engine, clock) in enumerate(zip(group.engines, group.clocks)):
        if not engine.has_unfinished_requests():
            idle += 1
            continue
        step = engine.step_detailed()
        for out in step.outputs:
            if not out.finished:
                continue
            if out.finish_reason == "abort":  # the scheduler gave up on it: its session ends
                res.aborted += 1
                live.pop(int(out.request_id))
            else:
                finished.append(int(out.request_id))
        batch = step.batch
        if not batch.seqs:
            idle += 1
            continue
        for new in batch.new_tables:
            if new.seq_id not in seen:  # first admission: the hit counted once, as in run_trace
                seen.add(new.seq_id)
                seq, sid, _ = live[new.seq_id]
                acc = res.hits_by_kind.setdefault(by_sid[sid].kind, [0, 0])
                acc[0] += seq.stats.reused
                acc[1] += seq.stats.prompt_tokens
        running[d] = sum(s.start_pos + s.num_tokens for s in batch.seqs)
        dt = clock.step(batch)
        longest = dt if longest is None else max(longest, dt)
    if longest is not None:
        res.padding_steps += idle
    return longest, finished, running


def _finish(group: _Replicas, wall_s: float) -> ReplicaRunResult:
    res = group.res
    res.wall_s = wall_s
    res.hit_tokens = sum(a[0] for a in res.hits_by_kind.values())
    res.prompt_tokens = sum(a[1] for a in res.hits_by_kind.values())
    res.preemptions = sum(e.scheduler.num_preemptions for e in group.engines)
    res.evictions = sum(e.scheduler.bm.comp.pool.num_evictions + e.scheduler.bm.swa.pool.num_evictions
                        for e in group.engines)
    mean_area = sum(group.token_area) / len(group.token_area)
    res.imbalance = max(group.token_area) / mean_area if mean_area else math.nan
    res.split_sessions = sum(len(ds) > 1 for ds in group.placed.values())
    return res


# ---- the comparison --------------------------------------------------------------------------
@dataclass(frozen=True)
class ReplicaReport:
    """Every router on one (geometry, workload) trace, and the single arena of the whole budget."""

    geometry: str
    workload: str
    replicas: int
    results: dict[str, ReplicaRunResult]
    single: RunResult


def compare_routers(geometry: str, workload: str, sessions: Seq[Session], cfg: SimConfig, replicas: int,
                    routers: Seq[str], log: Callable[[str], None] = print) -> ReplicaReport:
    """``routers`` (each one of :data:`POLICIES`) over ``replicas`` arenas, then the single arena."""
    unknown = [r for r in routers if r not in POLICIES]
    if unknown:
        raise ValueError(f"unknown router policy {unknown[0]!r}; accepted: {', '.join(POLICIES)}")
    results = {}
    for name in routers:
        r = results[name] = run_replicas(sessions, cfg, replicas, name)
        log(f"  [{geometry} {workload}] {replicas} replicas, {name} router: {r.steps} steps, "
            f"{r.modelled_s:.1f} modelled s in {r.wall_s:.1f} wall s, hit rate {r.hit_rate:.3f}")
    single = run_trace(sessions, ARENA, cfg)
    log(f"  [{geometry} {workload}] single arena: {single.steps} steps, hit rate {single.hit_rate:.3f}")
    return ReplicaReport(geometry, workload, replicas, results, single)


def format_replica_table(rep: ReplicaReport, budget_gib: float) -> str:
    lines = [f"## {rep.geometry} / {rep.workload}: {rep.replicas} replicas of {budget_gib / rep.replicas:g} GiB "
             f"against one arena of {budget_gib:g} GiB",
             "| router | hit rate | tok/s | imbalance | step imbalance | requests per replica | split sessions | "
             "padding steps | preempt | evictions | steps |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for name, r in rep.results.items():
        lines.append(f"| {name} | {r.hit_rate:.3f} | {r.throughput:,.0f} | {r.imbalance:.3f} | "
                     f"{r.step_imbalance:.3f} | {' / '.join(map(str, r.routed))} | {r.split_sessions} | "
                     f"{r.padding_steps:,} | "
                     f"{r.preemptions} | {r.evictions:,} | {r.steps:,} |")
    s = rep.single
    lines.append(f"| single arena | {s.hit_rate:.3f} | {s.throughput:,.0f} | - | - | {s.finished} | - | - | "
                 f"{s.preemptions} | {s.evictions:,} | {s.steps:,} |")
    return "\n".join(lines)


def replica_summary_line(reports: Seq[ReplicaReport], router: str) -> str:
    """``hit_rate_<workload>=<x> single_arena_hit_rate_<workload>=<y>`` for each workload (min over
    geometries), ``router``'s hit rate."""
    parts = []
    for wl in dict.fromkeys(r.workload for r in reports):
        reps = [r for r in reports if r.workload == wl]
        parts.append(f"hit_rate_{wl}={min(r.results[router].hit_rate for r in reps):.4f} "
                     f"single_arena_hit_rate_{wl}={min(r.single.hit_rate for r in reps):.4f}")
    return " ".join(parts)


def replica_main(ap: argparse.ArgumentParser, args: argparse.Namespace, geometries: Seq[str], workloads: Seq[str],
                 scale: float, costs: dict[str, CostModel]) -> int:
    """``simulate --replicas D``: the router comparison on each geometry and workload, one table each,
    then :func:`replica_summary_line` of the first ``--router`` named."""
    if args.host_kv_gib:
        ap.error("--host-kv-gib is not simulated with --replicas (each replica runs the device arena only)")
    routers = args.router or list(POLICIES)
    log: Callable[[str], None] = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    reports = []
    for geo in geometries:
        cfg = SimConfig(GEOMETRIES[geo], int(args.budget_gib * 2**30), args.max_num_seqs, args.max_batched_tokens,
                        cost=costs[geo])
        try:
            base_layout(replica_config(cfg, args.replicas))
        except ValueError as e:
            ap.error(f"--budget-gib {args.budget_gib} over --replicas {args.replicas} with {geo}: {e}")
        for wl in workloads:
            sessions = build_trace(wl, scale, args.seed, args.rate_scale)
            log(f"{geo} {wl}: {len(sessions)} sessions")
            rep = compare_routers(geo, wl, sessions, cfg, args.replicas, routers, log)
            reports.append(rep)
            print(format_replica_table(rep, args.budget_gib) + "\n", flush=True)
    print(replica_summary_line(reports, routers[0]))
    return 0
