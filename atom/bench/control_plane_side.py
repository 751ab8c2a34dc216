"""Side by side: atom's block manager and vLLM's ``KVCacheManager`` on the same traces.

For each block size and trace of :mod:`atom.bench.control_plane_trace`, the two managers replay
the trace in turn, ``reps`` times each, alternating which goes first, with garbage collected before
every run (the previous run's garbage is not this one's cost). A run is two replays on fresh
managers: one times each operation (less the clock's own cost), the other whole steps (no clock
reading inside a step). Per run, each operation's figure is the median of its calls and the step
figure is the mean over the trace's steps; the table gives the
median over runs and the spread over runs ((max - min) / median), both managers' hit tokens, and
atom / vLLM. The summary line covers block 128:
``peer_ratio_max_op=<f> peer_ratio_step_max=<f> hits_vs_peer_min=<f>`` (the largest per-operation
ratio, the largest per-step ratio, the smallest atom / vLLM hit-token ratio; a trace with no hit on
either side counts 1.0). Without vLLM atom runs alone, the table says so and the ratios are ``nan``.
"""

from __future__ import annotations

import gc
import math
import statistics
from typing import Callable, Sequence as Seq

from atom.bench.control_plane_engines import AtomReplay, VllmReplay, peer_missing
from atom.bench.control_plane_trace import TRACES, RunRecord, Trace, build_steps, replay

__all__ = ["OPS", "side_by_side"]

OPS = ("admit", "prefill_8k", "decode", "free")


def _run(make: Callable[[], object], steps: list) -> RunRecord:
    """One run: a replay timing each operation, then one on a fresh manager timing whole steps."""
    records = []
    for time_ops in (True, False):
        gc.collect()
        engine = make()
        gc.collect()  # building the requests leaves garbage too
        records.append(replay(engine, steps, time_ops=time_ops))
    ops, whole = records
    assert ops.hit_tokens == whole.hit_tokens, "the two replays of one trace hit differently"
    ops.steps = whole.steps
    return ops


def _summary(records: list[RunRecord]) -> dict[str, tuple[float, float]]:
    """Figure -> (median over runs, spread over runs) for every operation, ``step`` and ``hits``."""
    per_run: dict[str, list[float]] = {}
    for rec in records:
        for op, calls in rec.ops.items():
            per_run.setdefault(op, []).append(statistics.median(calls))
        per_run.setdefault("step", []).append(sum(rec.steps) / len(rec.steps))
        per_run.setdefault("hits", []).append(float(rec.hit_tokens))
    out = {}
    for key, vals in per_run.items():
        mid = statistics.median(vals)
        out[key] = (mid, (max(vals) - min(vals)) / mid if mid else 0.0)
    return out


def _cell(fig: tuple[float, float] | None) -> str:
    return "-" if fig is None else f"{fig[0]:.1f} (±{fig[1] * 50:.0f}%)"


def compare(trace: Trace, block: int, decode_steps: int, reps: int, peer: bool
            ) -> tuple[dict[str, tuple[float, float]], dict[str, tuple[float, float]] | None]:
    """(atom's summary, vLLM's summary or None) for one trace at one block size."""
    steps = build_steps(trace, decode_steps)
    atom: list[RunRecord] = []
    vllm: list[RunRecord] = []
    for r in range(reps):
        order = [("atom", lambda: AtomReplay(trace, block, decode_steps))]
        if peer:
            order.append(("vllm", lambda: VllmReplay(trace, block, decode_steps)))
        for name, make in order if r % 2 == 0 else order[::-1]:
            (atom if name == "atom" else vllm).append(_run(make, steps))
    return _summary(atom), _summary(vllm) if peer else None


def side_by_side(block_sizes: Seq[int], decode_steps: int, reps: int) -> tuple[float, float, float]:
    """Print the side-by-side table; return (max op ratio, max step ratio, min hit ratio) at block 128."""
    why = peer_missing()
    peer = why is None
    print(f"peer: vLLM {_vllm_version()}" if peer else f"peer: none ({why}); atom runs alone")
    print("| trace | block | figure | atom us | vLLM us | atom/vLLM |")
    print("|---|---|---|---|---|---|")
    op_ratios, step_ratios, hit_ratios = [], [], []
    for block in block_sizes:
        for trace in TRACES:
            a, v = compare(trace, block, decode_steps, reps, peer)
            for key in (*OPS, "step"):
                if key not in a:
                    continue
                vf = v.get(key) if v else None
                ratio = a[key][0] / vf[0] if vf else math.nan
                label = "per step" if key == "step" else key
                print(f"| {trace.name} | {block} | {label} | {_cell(a[key])} | {_cell(vf)} | {ratio:.2f} |", flush=True)
                if block == 128:
                    (step_ratios if key == "step" else op_ratios).append(ratio)
            ah, vh = a["hits"][0], (v["hits"][0] if v else math.nan)
            hit_ratio = 1.0 if ah == vh == 0 else (ah / vh if vh else math.nan)
            print(f"| {trace.name} | {block} | hit tokens | {ah:.0f} | {vh:.0f} | {hit_ratio:.3f} |", flush=True)
            if block == 128:
                hit_ratios.append(hit_ratio)
    if not peer:
        return math.nan, math.nan, math.nan
    return max(op_ratios), max(step_ratios), min(hit_ratios)


def _vllm_version() -> str:
    import vllm
    return vllm.__version__
