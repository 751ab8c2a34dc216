"""Control-plane speed: cost per operation, and scheduler + block-manager time per decode step.

    python -m atom.bench.control_plane [--seqs 1 64 256] [--contexts 4096 32768 131072] [--steps 64]
                                       [--block-sizes 128 256] [--decode-steps 32] [--reps 5]
                                       [--ops-reps 15] [--peer vllm]

First a per-operation table (admit, 8K prefill chunk, decode, free, and with the whole arena cached
the eviction room check and a chunk reclaim; microseconds per call) for the workloads of
:mod:`atom.bench.control_plane_ops` at each block size, then the decode-step table.
Every configuration of the decode-step table runs ``--reps`` times (default 5), and of the
per-operation table ``--ops-reps`` times (default 15: a round of it takes seconds, and its smallest
figures, the frees of a 4K request in a few microseconds, need more runs for their lowest to hold
from one invocation to the next; see ``docs/benchmarks.md``), round-robin: the first run of every
configuration of a table, then the second, and so on, so that a burst of load from other processes
lands in one run of several configurations instead of every run of one; each round (every
configuration of a table once) runs in a fresh process (:func:`_fresh_rounds`). Garbage is collected before each run and
the collector is frozen and off while it is timed (see :func:`atom.bench.control_plane_ops.frozen_gc`).

A run is a fixed sequence of calls (or steps), the same in every run, each timed on its own: the
k-th sample of every run measures the same work. A table figure is, per call, the lowest of its
runs' samples, then the median over the calls
(:func:`atom.bench.control_plane_summary.lowest_per_call`). Other processes only ever
add time to a sample (they take the CPU, its caches and execution units), so the lowest of a call's
samples is the nearest to the code's own cost, and a call needs only one undisturbed run of its
runs; the median over calls keeps the figure the cost of a typical call (the first admission
of a shared prefix, which computes it, does not set the shared-prefix figure). Each row's ``spread``
is the largest (max - min) / min over the runs of the run's own median call: what the runs
disagreed by before the lowest was taken.

Real V4-Flash geometry (fp8 rows), an arena budget sized to fit the batch (the control plane
allocates no tensors), a fake runner, all driven by :class:`LLMEngine`. Each configuration first
prefills its requests to the given context, then times ``LLMEngine.step`` (schedule, postprocess and
the engine's per-request outputs) over ``WINDOWS`` windows of ``--steps`` decode steps a short pause
apart (:func:`time_decode`), less the fake runner's own time (the figure: per step of a window, the
lowest over the windows of all runs, then the median step; the spread is over those windows). Step
times are the timing process's CPU time (``time.process_time_ns``; a step takes tens of microseconds
to milliseconds, long enough to lose the CPU under load, and the time other processes then run is
not counted); per-operation samples are wall-clock time
(``time.perf_counter_ns``, see :mod:`atom.bench.control_plane_ops`).
The last line is ``step_us_per_seq_256=<float> growth_4k_to_128k=<float>``:
microseconds per step per sequence with 256 sequences at the largest context, and the ratio of the
per-step time at the largest context to the smallest one with 256 sequences (target <= 1.2). The line
before it is ``ops_b128 decode_us=<f> admit_us=<f> prefill_8k_us=<f> free_128k_us=<f>`` at block 128:
decode (decode-heavy), admission and an 8K prefill chunk and freeing (long-context, 128K prompts).
Block sizes must be multiples of the model's largest compress ratio (128 for V4-Flash).

With ``--peer vllm`` it instead replays the engine-neutral traces of
:mod:`atom.bench.control_plane_trace` on atom's block manager and on vLLM's ``KVCacheManager``
(:mod:`atom.bench.control_plane_side`; ``--reps`` runs of each, alternating), and its last line is
``peer_ratio_max_op=<float> peer_ratio_step_max=<float> hits_vs_peer_min=<float>``. Without vLLM
importable it runs atom alone and says so (the ratios are then ``nan``).
"""

from __future__ import annotations

import argparse
import functools
import gc
import math
import multiprocessing
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
from typing import Callable, Sequence as Seq, TypeVar

from atom.bench.control_plane_ops import WORKLOADS, Workload, frozen_gc, measure_ops
from atom.bench.control_plane_summary import lowest_per_call
from atom.config import CacheConfig, SchedulerConfig
from atom.kv.block_manager import BlockManager
from atom.testing.fake_runner import FakeRunner
from atom.kv.kv_layout import KvLayout, chunk_shape
from atom.model_engine.llm_engine import LLMEngine
from atom.step_contract import RunnerOutput, ScheduledBatch
from atom.model_engine.scheduler import Scheduler
from atom.model_engine.sequence import Sequence
from atom.models.deepseek_v4.config import DeepseekV4Config
from atom.sampling_params import SamplingParams

T = TypeVar("T")

WINDOWS = 4  # timed windows of decode steps per run of a decode-step configuration
WINDOW_GAP_S = 0.3  # pause between them


class TimedRunner(FakeRunner):
    """The fake runner, adding the CPU time of its own calls to ``seconds``."""

    seconds = 0.0

    def execute(self, batch: ScheduledBatch) -> RunnerOutput:
        t0 = time.process_time_ns()
        out = super().execute(batch)
        self.seconds += (time.process_time_ns() - t0) / 1e9
        return out


def build(num_seqs: int, context: int, steps: int) -> tuple[LLMEngine, TimedRunner]:
    spec = DeepseekV4Config.from_preset("deepseek_v4_flash").kv_spec()
    max_new = num_seqs + steps + 8  # requests decode while the later ones are still being prefilled
    max_len = context + max_new
    limits = SchedulerConfig(max_num_batched_tokens=context + num_seqs, max_num_seqs=num_seqs, max_model_len=max_len)
    shape = chunk_shape(spec, CacheConfig())
    comp_pages = num_seqs * (-(-max_len // spec.block_size))
    swa_pages = num_seqs * (spec.tail_blocks + 2) + -(-(context + num_seqs) // spec.block_size) + 2
    # + one chunk per request: an upper bound for the compressor-state pages
    chunks = -(-comp_pages // shape.compress_pages_per_chunk) + -(-swa_pages // shape.chunk_pages) + num_seqs + 2
    layout = KvLayout.for_chunks(spec, chunks, limits)
    runner = TimedRunner(vocab_size=256)
    engine = LLMEngine(Scheduler(limits, BlockManager(layout, CacheConfig()), eos_token_id=None), runner)
    for i in range(num_seqs):
        params = SamplingParams(max_tokens=max_new, ignore_eos=True)
        engine.add_sequence(Sequence(_prompt(i, context), params, engine.scheduler.block_size))
    return engine, runner


@functools.lru_cache(maxsize=None)
def _prompt(i: int, context: int) -> list[int]:
    """Request ``i``'s prompt of ``context`` tokens (small ints: no per-token objects), kept for the
    process: every run of a configuration builds the same prompts, and building 256 of 128K tokens
    took about 2 s of the run's 9 s of CPU. The engine's :class:`Sequence` copies it."""
    return [(i * 7919 + j * 31) % 256 for j in range(context)]


def time_decode(num_seqs: int, context: int, steps: int) -> list[list[float]]:
    """One run: CPU microseconds of engine decode steps (schedule + postprocess + outputs, less the
    fake runner) in ``WINDOWS`` windows of ``steps`` steps, ``WINDOW_GAP_S`` seconds apart, each
    window after one untimed step (the caches refilled after the pause); one list per window.

    The windows continue the same decode, and every step of one does the same work (each request
    decodes one token), so the k-th step of every window is a sample of the same step. Why windows:
    on the shared machine a whole window of steps of 256 requests ran 2x slower than the next one
    under other processes' memory traffic, while a second build of the engine costs seconds of CPU."""
    engine, runner = build(num_seqs, context, (steps + 1) * WINDOWS)
    sched = engine.scheduler
    while any(s.in_prefill for s in sched.running) or sched.waiting:
        engine.step()
    windows = []
    clock = time.process_time_ns
    with frozen_gc():  # the prefill's garbage is not the decode steps' cost, nor is walking its requests
        for w in range(WINDOWS):
            if w:
                time.sleep(WINDOW_GAP_S)
            engine.step()
            times = []
            for _ in range(steps):
                runner.seconds = 0.0
                t0 = clock()
                batch = engine.step_detailed().batch
                times.append((clock() - t0) / 1e3 - runner.seconds * 1e6)
                assert len(batch.seqs) == num_seqs and batch.num_tokens == num_seqs
            windows.append(times)
    return windows


def _round_robin(runs: Seq[Callable[[], T]], reps: int) -> list[list[T]]:
    """``reps`` results of each of ``runs``, taken round-robin (every run once, then again, ...), with
    garbage collected before each (an earlier run's garbage is not this one's cost)."""
    out: list[list[T]] = [[] for _ in runs]
    for _ in range(reps):
        for run, results in zip(runs, out):
            gc.collect()
            results.append(run())
    return out


def _fresh_rounds(round_fn: Callable[[], list[T]], reps: int) -> list[list[T]]:
    """``reps`` calls of ``round_fn`` (a round: one result per configuration, in order), each in a
    fresh process (spawned, so it shares no heap with this one); per configuration, its results.

    Why: within one process the runs of a configuration share one heap layout and hash seed, and on
    the development machine a configuration could run about 1.5x slower in every run of one
    invocation than in the next (all five long-context runs at block 256 once, every 64 x 4K engine
    step once); runs in separate processes sample that as well, so the lowest of them is not stuck."""
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=spawn, max_tasks_per_child=1) as pool:
        rounds = [pool.submit(round_fn).result() for _ in range(reps)]
    return [list(results) for results in zip(*rounds)]


def _ops_round(rows: list[tuple[Workload, int]], decode_steps: int) -> list[dict[str, list[float]]]:
    """One round of the per-operation table: :func:`measure_ops` of every row once, in order."""
    return [runs[0] for runs in _round_robin([functools.partial(measure_ops, w, block, decode_steps)
                                              for w, block in rows], 1)]


def ops_table(block_sizes: Seq[int], decode_steps: int, reps: int) -> str:
    """Print the per-operation table (``reps`` rounds over the rows, each in a fresh process; each
    figure from :func:`~atom.bench.control_plane_summary.lowest_per_call`, the last column the
    largest spread of the row's figures); return the ``ops_b128 ...`` line (printed later, second
    to last)."""
    rows = [(w, block) for block in block_sizes for w in WORKLOADS]
    results = _fresh_rounds(functools.partial(_ops_round, rows, decode_steps), reps)
    print("| workload | block | admit us | 8K prefill chunk us | decode us | free us | room check us | reclaim us | spread |")
    print("|---|---|---|---|---|---|---|---|---|")
    ops = {}
    for (w, block), runs in zip(rows, results):
        figs = {k: lowest_per_call([r[k] for r in runs]) for k in runs[0]}
        us = ops[(w.name, block)] = {k: mid for k, (mid, _) in figs.items()}
        spread = max((sp for mid, sp in figs.values() if not math.isnan(mid)), default=0.0)
        print(f"| {w.name} ({w.num_seqs} x {w.context / 1024:g}K) | {block} | {us['admit']:.1f} | "
              f"{us['prefill']:.1f} | {us['decode']:.2f} | {us['free']:.1f} | {us['room']:.1f} | "
              f"{us['reclaim']:.1f} | {spread:.0%} |", flush=True)
    heavy, long = ops[("decode-heavy", 128)], ops[("long-context", 128)]
    return (f"ops_b128 decode_us={heavy['decode']:.2f} admit_us={long['admit']:.1f} "
            f"prefill_8k_us={long['prefill']:.1f} free_128k_us={long['free']:.1f}")


def _step_round(rows: list[tuple[int, int]], steps: int) -> list[list[list[float]]]:
    """One round of the decode-step table: :func:`time_decode` of every row once, in order."""
    return [runs[0] for runs in _round_robin([functools.partial(time_decode, n, ctx, steps) for n, ctx in rows], 1)]


def step_table(seqs: Seq[int], contexts: Seq[int], steps: int, reps: int) -> dict[tuple[int, int], float]:
    """Print the decode-step table (``reps`` rounds over the rows, each in a fresh process; each
    figure from :func:`lowest_per_call` over the steps of all windows of all rounds); return
    (running seqs, context) -> that figure in microseconds."""
    rows = [(n, ctx) for n in seqs for ctx in contexts]
    results = _fresh_rounds(functools.partial(_step_round, rows, steps), reps)
    results = [[window for run in runs for window in run] for runs in results]  # every window a sample run
    print("| running seqs | context | us per step | us per step per seq | spread |")
    print("|---|---|---|---|---|")
    out = {}
    for (n, ctx), runs in zip(rows, results):
        us, spread = lowest_per_call(runs)
        out[(n, ctx)] = us
        print(f"| {n} | {ctx} | {us:.1f} | {us / n:.2f} | {spread:.0%} |", flush=True)
    return out


def main(argv: Seq[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m atom.bench.control_plane", description=__doc__.split("\n\n")[0])
    ap.add_argument("--seqs", type=int, nargs="+", default=[1, 64, 256])
    ap.add_argument("--contexts", type=int, nargs="+", default=[4096, 32768, 131072])
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--block-sizes", type=int, nargs="+", default=[128, 256])
    ap.add_argument("--decode-steps", type=int, default=32, help="decode steps per request in the ops table")
    ap.add_argument("--peer", choices=["vllm"], help="replay the same traces on vLLM's KVCacheManager too")
    ap.add_argument("--reps", type=int, default=5,
                    help="runs of each decode-step configuration (with --peer: of each manager per trace); the "
                         "tables give per call the lowest run, then the median call")
    ap.add_argument("--ops-reps", type=int, default=15,
                    help="runs of each configuration of the per-operation table (each in a fresh process)")
    args = ap.parse_args(argv)
    if args.reps < 1 or args.ops_reps < 1:
        ap.error("--reps and --ops-reps must be positive")
    if min(args.seqs) < 1 or min(args.contexts) < 1 or args.steps < 1 or args.decode_steps < 1:
        ap.error("--seqs, --contexts, --steps and --decode-steps must be positive")
    if 128 not in args.block_sizes or any(b % 128 for b in args.block_sizes):
        ap.error("--block-sizes must include 128, and every size must be a multiple of 128 (V4-Flash's HCA ratio)")
    if args.peer:
        from atom.bench.control_plane_side import side_by_side
        op, step, hits = side_by_side(args.block_sizes, args.decode_steps, args.reps)
        print(f"peer_ratio_max_op={op:.3f} peer_ratio_step_max={step:.3f} hits_vs_peer_min={hits:.3f}")
        return 0
    ops_line = ops_table(args.block_sizes, args.decode_steps, args.ops_reps)
    results = step_table(args.seqs, args.contexts, args.steps, args.reps)
    n = max(args.seqs)
    lo, hi = min(args.contexts), max(args.contexts)
    print(ops_line)
    print(f"step_us_per_seq_{n}={results[(n, hi)] / n:.3f} growth_{lo // 1024}k_to_{hi // 1024}k="
          f"{results[(n, hi)] / results[(n, lo)]:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
