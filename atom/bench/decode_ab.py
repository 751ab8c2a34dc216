"""Decode steps of two source trees timed back to back: ``python -m atom.bench.decode_ab --old TREE``.

    python -m atom.bench.decode_ab --old /path/to/old/checkout [--new .] [--batches 1,32] [--rounds 9]

Compares the torch-backend decode step of thin V4-Flash (:func:`atom.bench.forward.thin_config`, random weights
of seed 0, every request holding ``--context`` tokens) between this tree and another checkout of the project,
for example an older commit in a ``git worktree``. Each tree runs in its own worker process (this file run as
a script with the tree first on ``sys.path``, so the worker imports that tree's ``atom``; a tree whose
``kernels/`` is not importable as ``atom.kernels`` needs a link ``atom/kernels -> ../kernels``). A worker
builds the engine with its tree's constructors, prefills every batch, runs each decode step once untimed,
then times ``ModelRunner.execute`` of the step on request. The driver alternates the two workers step by
step (old, new; then new, old), so both see the same load on a shared machine, and prints per batch the
median wall ms of each, the median of the per-pair ratios new / old, and the median process CPU ms.

Trees from before the ``atom.kv`` package and the serving model (such as 0e8126b) take the older
constructors: the arena planner and block manager in ``atom.model_engine`` and the reference model, whose
layers the runner then drives itself.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path


def _worker(cfg_json: str, batches: list[int], context: int, threads: int) -> None:
    """Build the engine of the tree on ``sys.path``, prefill each batch, then time one step per stdin line."""
    import torch

    from atom.config import CacheConfig, SchedulerConfig
    from atom.model_engine.llm_engine import LLMEngine
    from atom.model_engine.scheduler import Scheduler
    from atom.model_executor.model_runner import ModelRunner
    from atom.models.deepseek_v4.checkpoint import random_state_dict
    from atom.models.deepseek_v4.config import DeepseekV4Config
    from atom.sampling_params import SamplingParams

    try:
        from atom.kv.block_manager import BlockManager
        from atom.kv.kv_layout import plan_kv_layout
        from atom.models.deepseek_v4_serving import DeepseekV4ForServing as model_class

        def spec_of(cfg):
            return cfg.kv_spec("fp32", include_mtp=False)
    except ImportError:  # the older tree (module docstring)
        from atom.model_engine.block_manager import BlockManager
        from atom.model_engine.kv_layout import plan_kv_layout
        from atom.model_executor.engine_builder import kv_spec_of as spec_of
        from atom.models.deepseek_v4.model import DeepseekV4Model as model_class

    torch.set_num_threads(threads)
    sent = json.loads(cfg_json)
    known = {f.name for f in dataclasses.fields(DeepseekV4Config)}
    unknown = [k for k in sent["fields"] if k not in known and k not in sent["at_default"]]
    if unknown:
        raise SystemExit(f"this tree's DeepseekV4Config lacks {unknown}, which the thin model sets")
    cfg = DeepseekV4Config(**{k: tuple(v) if isinstance(v, list) else v for k, v in sent["fields"].items()
                              if k in known})
    model = model_class(cfg)
    model.load_state_dict(random_state_dict(cfg, seed=0))
    model.eval()
    greedy = SamplingParams(max_tokens=1024, temperature=0.0, ignore_eos=True)
    steps = {}
    with torch.no_grad():
        for b in batches:
            prompts = [torch.randint(1, cfg.vocab_size, (context,), generator=torch.Generator().manual_seed(1000 + i))
                       .tolist() for i in range(b)]
            max_len = context + greedy.max_tokens
            cache = CacheConfig(kv_cache_bytes=1 << 30, enable_prefix_caching=False)
            limits = SchedulerConfig(max_num_batched_tokens=max(context, b), max_num_seqs=b, max_model_len=max_len)
            layout = plan_kv_layout(spec_of(cfg), cache, limits)
            sched = Scheduler(limits, BlockManager(layout, cache), eos_token_id=None)
            runner = ModelRunner(model, layout, max_model_len=max_len, kernel_backend="torch")
            engine = LLMEngine(sched, runner, max_model_len=max_len)
            for p in prompts:
                engine.add_request(p, greedy)
            while sched.waiting or any(s.in_prefill for s in sched.running):
                engine.step()
            batch = sched.schedule()
            if len(batch.seqs) != b or any(s.num_tokens != 1 for s in batch.seqs):
                raise RuntimeError(f"batch {b}: the requests were not all decoding together")
            runner.execute(batch)  # untimed first run
            steps[b] = (runner, batch)
        import atom

        print(f"ready {Path(atom.__file__).parent.parent}", flush=True)
        for line in sys.stdin:
            runner, batch = steps[int(line)]
            c0, t0 = time.process_time(), time.perf_counter()
            runner.execute(batch)
            t1, c1 = time.perf_counter(), time.process_time()
            print(f"{(t1 - t0) * 1e3:.2f} {(c1 - c0) * 1e3:.2f}", flush=True)


def _start(tree: Path, cfg_json: str, args: argparse.Namespace) -> subprocess.Popen:
    cmd = [sys.executable, __file__, "--worker", cfg_json, "--tree", str(tree), "--batches", args.batches,
           "--context", str(args.context), "--threads", str(args.threads)]
    proc = subprocess.Popen(cmd, cwd=tree, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline().split()
    if not line or line[0] != "ready" or Path(line[1]).resolve() != tree.resolve():
        raise SystemExit(f"the worker for {tree} did not start on that tree (it said {line})")
    return proc


def _compare(procs: dict, b: int, rounds: int) -> None:
    wall: dict[str, list[float]] = {"old": [], "new": []}
    cpu: dict[str, list[float]] = {"old": [], "new": []}
    for i in range(rounds):
        for name in ("old", "new") if i % 2 == 0 else ("new", "old"):
            procs[name].stdin.write(f"{b}\n")
            procs[name].stdin.flush()
            w, c = map(float, procs[name].stdout.readline().split())
            wall[name].append(w)
            cpu[name].append(c)
    ratio = statistics.median(n / o for o, n in zip(wall["old"], wall["new"]))
    print(f"b{b}: wall ms median old {statistics.median(wall['old']):.1f} new {statistics.median(wall['new']):.1f}"
          f" (pair ratio new/old {ratio:.3f}); cpu ms median old {statistics.median(cpu['old']):.1f} new "
          f"{statistics.median(cpu['new']):.1f} ({rounds} steps each)", flush=True)
    for name in ("old", "new"):
        print(f"  {name} wall ms: {' '.join(f'{t:.0f}' for t in wall[name])}", flush=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--old", type=Path, help="the other checkout (its root)")
    ap.add_argument("--new", type=Path, default=Path(__file__).resolve().parents[2], help="default: this tree")
    ap.add_argument("--batches", default="1,32", help="comma-separated decode batch sizes")
    ap.add_argument("--context", type=int, default=160, help="tokens each request holds")
    ap.add_argument("--rounds", type=int, default=9, help="timed steps per tree and batch")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads of each worker")
    ap.add_argument("--worker", metavar="CONFIG_JSON", help=argparse.SUPPRESS)
    ap.add_argument("--tree", help=argparse.SUPPRESS)  # the worker's tree (first on its sys.path)
    args = ap.parse_args(argv)
    batches = [int(b) for b in args.batches.split(",") if b.strip()]
    if not batches or min(batches) < 1 or args.rounds < 1 or args.context < 2 or args.threads < 1:
        raise SystemExit("--batches must be positive integers, --rounds and --threads >= 1, --context >= 2")
    if args.worker:
        _worker(args.worker, batches, args.context, args.threads)
        return
    if args.old is None or not (args.old / "atom").is_dir():
        raise SystemExit(f"--old {args.old}: give the root of another checkout (a directory holding atom/)")
    from atom.bench.forward import thin_config

    cfg = thin_config("flash")  # every field, and which are at their default (an older tree may lack those)
    cfg_json = json.dumps({"fields": dataclasses.asdict(cfg), "at_default": [
        f.name for f in dataclasses.fields(cfg) if getattr(cfg, f.name) == f.default]})
    procs = {"old": _start(args.old, cfg_json, args), "new": _start(args.new, cfg_json, args)}
    print(f"thin flash decode, torch kernels, context {args.context}, {args.threads} thread(s) per worker; "
          f"old {args.old}, new {args.new}", flush=True)
    try:
        for b in batches:
            _compare(procs, b, args.rounds)
    finally:
        for proc in procs.values():
            proc.stdin.close()
            proc.wait()


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        # this file's folder out, the tree it times in: the worker imports that tree's atom
        sys.path[0] = sys.argv[sys.argv.index("--tree") + 1]
    main()
