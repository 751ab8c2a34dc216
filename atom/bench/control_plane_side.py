"""Side by side: atom's block manager and vLLM's ``KVCacheManager`` on the same traces.

For each block size and trace of :mod:`atom.bench.control_plane_trace`, the two managers replay
the trace in turn, ``reps`` times each, alternating which goes first. A run is two replays on fresh
managers: one times each operation (wall clock, less the clock's own cost), the other whole steps
(CPU time, no clock reading inside a step). Both managers are measured alike: garbage is collected
before each replay and the collector is frozen and off while it runs
(:func:`atom.bench.control_plane_ops.frozen_gc`: no collection lands in a timed call, on either
side). A manager replays the same calls in every run, so its figures are taken per call
(:func:`atom.bench.control_plane_summary.lowest_per_call`): an operation's figure is the median over
its calls of each call's lowest time over the runs, the step figure the mean over the trace's steps
of each step's lowest time over the runs; the spread is (max - min) / min over the runs of each run's
own median (mean for steps). The table gives the figures, half the spread (``±``), both managers'
hit tokens, and atom / vLLM. The summary line covers block 128:
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
from atom.bench.control_plane_ops import frozen_gc
from atom.bench.control_plane_summary import lowest_per_call
from atom.bench.control_plane_trace import TRACES, RunRecord, Trace, build_steps, replay

__all__ = ["OPS", "side_by_side"]

OPS = ("admit", "prefill_8k", "decode", "free")


def _run(make: Callable[[], object], steps: list) -> RunRecord:
    """One run: a replay timing each operation, then one on a fresh manager timing whole steps, each
    with the collector frozen and off (the garbage of building the manager collected first)."""
    records = []
    for time_ops in (True, False):
        gc.collect()
        engine = make()
        with frozen_gc():
            records.append(replay(engine, steps, time_ops=time_ops))
    ops, whole = records
    assert ops.hit_tokens == whole.hit_tokens, "the two replays of one trace hit differently"
    ops.steps = whole.steps
    return ops


def _summary(records: list[RunRecord]) -> dict[str, tuple[float, float]]:
    """Figure -> (figure, spread over runs) for every operation and ``step`` (see the module
    docstring), and ``hits`` -> (hit tokens, 0.0): every run of a manager hits alike."""
    hits = {rec.hit_tokens for rec in records}
    assert len(hits) == 1, f"the runs of one manager hit different token counts: {sorted(hits)}"
    out = {op: lowest_per_call([rec.ops[op] for rec in records]) for op in records[0].ops}
    out["step"] = lowest_per_call([rec.steps for rec in records], centre=statistics.mean)
    out["hits"] = (float(hits.pop()), 0.0)
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
