"""Host time of one engine step with the overlapped loop on and off: ``python -m atom.bench.overlap``.

The engine steps decode-heavy requests on V4-Flash KV geometry with the fake runner (no model: what
is timed is the control plane) and the built-in model's tokenizer (so the outputs are detokenized as
in serving). Each phase is timed in CPU time of the engine's thread (``time.thread_time``), so other
processes on the machine do not inflate it. Per step, sequentially every phase waits for the step or
is waited for by it (schedule, runner, postprocess, outputs); overlapped, what runs beside the step on
a GPU (the ahead schedule, the outputs of requests without stop strings) is reported apart from what
stays between two steps (postprocess, completing the ahead batch, the launch). The fake runner's
``execute`` stands for the launch; on a GPU the step's own host work runs on the step thread.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from typing import Any, Callable, Sequence as Seq

from atom.builtin_model import ensure_builtin_model
from atom.config import CacheConfig, SchedulerConfig
from atom.kv.block_manager import BlockManager
from atom.kv.kv_layout import KvLayout, chunk_shape
from atom.model_engine.llm_engine import LLMEngine
from atom.model_engine.scheduler import Scheduler
from atom.model_engine.sequence import Sequence
from atom.models.deepseek_v4.config import DeepseekV4Config
from atom.sampling_params import SamplingParams
from atom.testing.fake_runner import FakeRunner
from atom.tokenizer import Tokenizer

__all__ = ["measure", "main"]


def _engine(seqs: int, prompt: int, output: int, overlap: bool, tokenizer: Tokenizer) -> LLMEngine:
    spec = DeepseekV4Config.from_preset("deepseek_v4_flash").kv_spec()
    max_len = prompt + output + 1
    limits = SchedulerConfig(max_num_batched_tokens=8192, max_num_seqs=seqs, max_model_len=max_len, overlap=overlap)
    cache = CacheConfig(block_size=spec.block_size)
    shape = chunk_shape(spec, cache)
    comp = seqs * -(-max_len // spec.block_size)
    swa = seqs * (spec.tail_blocks + 2 + 8192 // spec.block_size)
    chunks = -(-comp // shape.compress_pages_per_chunk) + -(-swa // shape.chunk_pages) + seqs + 2
    bm = BlockManager(KvLayout.for_chunks(spec, chunks, limits, cache), cache)
    engine = LLMEngine(Scheduler(limits, bm, eos_token_id=None), FakeRunner(vocab_size=tokenizer.vocab_size), tokenizer)
    for i in range(seqs):
        ids = [(i * 7919 + j * 31) % (tokenizer.vocab_size - 1) + 1 for j in range(prompt)]
        engine.add_sequence(Sequence(ids, SamplingParams(max_tokens=output, ignore_eos=True), bm.block_size))
    return engine


def _timed(acc: dict[str, float], key: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def call(*args: Any, **kwargs: Any) -> Any:
        t = time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            acc[key] = acc.get(key, 0.0) + time.thread_time() - t
    return call


def measure(seqs: int, prompt: int, output: int, overlap: bool, tokenizer: Tokenizer) -> dict[str, float]:
    """Milliseconds of engine-thread CPU time per step, per phase, over a run to completion."""
    engine = _engine(seqs, prompt, output, overlap, tokenizer)
    acc: dict[str, float] = {}
    sched = engine.scheduler
    for name in ("schedule", "schedule_ahead", "complete_ahead", "postprocess"):
        setattr(sched, name, _timed(acc, name, getattr(sched, name)))  # schedule_ahead includes schedule
    engine.runner.execute = _timed(acc, "runner", engine.runner.execute)
    engine._output = _timed(acc, "outputs", engine._output)
    gc.collect()
    steps = 0
    while engine.has_unfinished_requests():
        engine.step()
        steps += 1
    return {k: v / steps * 1e3 for k, v in acc.items()}


def main(argv: Seq[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m atom.bench.overlap", description=__doc__.split("\n\n")[0])
    ap.add_argument("--seqs", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--prompt", type=int, default=256, help="prompt tokens per request")
    ap.add_argument("--output", type=int, default=64, help="output tokens per request")
    ap.add_argument("--reps", type=int, default=5, help="runs per configuration (medians are printed)")
    args = ap.parse_args(argv)
    tokenizer = Tokenizer.from_dir(ensure_builtin_model())
    print("| requests | loop | between two steps (ms) | beside the running step (ms) | phases (ms per step) |")
    print("|---|---|---|---|---|")
    for seqs in args.seqs:
        for overlap in (False, True):
            runs = [measure(seqs, args.prompt, args.output, overlap, tokenizer) for _ in range(args.reps)]
            m = {k: statistics.median(r.get(k, 0.0) for r in runs) for k in runs[0]}
            if overlap:
                between = m["postprocess"] + m["complete_ahead"] + m["runner"]
                beside = m["schedule_ahead"] + m["outputs"]
            else:
                between, beside = m["schedule"] + m["runner"] + m["postprocess"] + m["outputs"], 0.0
            phases = ", ".join(f"{k} {v:.3f}" for k, v in sorted(m.items()))
            print(f"| {seqs} | {'overlapped' if overlap else 'sequential'} | {between:.3f} | {beside:.3f} | {phases} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
