"""Speculative decoding figures: mean acceptance length and tokens per target forward.

``python -m atom.bench.speculative [--model DIR] [--device cpu|cuda] [--num-tokens 1 2 3] [--prompts N]
[--max-tokens N]`` runs greedy requests one at a time (so one engine step is one target forward of
one request) without speculation, then with each K and each draft source:

- ``mtp``: the checkpoint's MTP layer (on the built-in tiny model its random weights make acceptance
  meaningless: the line shows the machinery's cost, not the draft quality);
- ``oracle``: the speculation-off run's own tokens replayed (every draft accepted: the ceiling).

Per run it prints one line: drafts proposed and accepted, mean acceptance length (tokens per verifying
step), tokens per target forward (output tokens / engine steps, prefill steps included), whether
the tokens equal the speculation-off run's, and the wall time.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

from atom.config import MAX_SPECULATIVE_TOKENS, CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from atom.engine_builder import build_engine
from atom.spec_decode.draft_source import DraftSource
from atom.testing.replay_draft import ReplayDraft
from atom.sampling_params import SamplingParams

__all__ = ["SpecRun", "run_speculative", "bench_prompts", "main"]


@dataclass(frozen=True)
class SpecRun:
    source: str  # "off", "mtp" or "oracle"
    num_tokens: int
    outputs: tuple[tuple[int, ...], ...]
    steps: int
    proposed: int
    accepted: int
    mean_acceptance_length: float
    seconds: float

    @property
    def tokens_per_forward(self) -> float:
        return sum(len(o) for o in self.outputs) / self.steps if self.steps else 0.0

    def line(self, baseline: "SpecRun | None") -> str:
        same = "" if baseline is None else f"  same tokens as off: {self.outputs == baseline.outputs}"
        return (f"{self.source:>6} K={self.num_tokens}  proposed {self.proposed:5d}  accepted {self.accepted:5d}  "
                f"mean acceptance length {self.mean_acceptance_length:.3f}  tokens/target forward "
                f"{self.tokens_per_forward:.3f}  ({self.steps} forwards, {self.seconds:.2f} s){same}")


def bench_prompts(n: int) -> list[list[int]]:
    return [[(37 * i + 11 * (20 + 9 * j)) % 500 + 1 for i in range(20 + 9 * j)] for j in range(n)]


def run_speculative(prompts: list[list[int]], max_tokens: int, num_tokens: int, drafter: DraftSource | None,
                    *, model: str | None = None, device: str = "cpu", source: str = "") -> SpecRun:
    """Run ``prompts`` one at a time (greedy) on a fresh engine with ``num_tokens`` drafts per step."""
    limits = SchedulerConfig(max_num_batched_tokens=256, max_num_seqs=4, max_model_len=1024,
                             speculative_num_tokens=num_tokens)
    config = EngineConfig(ModelConfig(path=model, device=device), limits, CacheConfig(kv_cache_bytes=64 << 20))
    engine = build_engine(config, drafter=drafter)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    outputs, steps, t0 = [], 0, time.perf_counter()
    for p in prompts:
        rid = engine.add_request(p, params)
        while engine.has_unfinished_requests():
            steps += 1
            for out in engine.step():
                if out.finished and out.request_id == rid:
                    outputs.append(tuple(out.output_token_ids))
    st = engine.stats()
    return SpecRun(source or ("off" if not num_tokens else "mtp"), num_tokens, tuple(outputs), steps,
                   st.spec_proposed, st.spec_accepted, st.spec_mean_acceptance_length, time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> list[SpecRun]:
    ap = argparse.ArgumentParser(prog="python -m atom.bench.speculative", description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="checkpoint directory (default: the built-in tiny model)")
    ap.add_argument("--device", default="cpu", help="cpu, cuda[:N] or rocm[:N] (default: cpu)")
    ap.add_argument("--num-tokens", type=int, nargs="+", default=[1, 2, 3],
                    choices=range(1, MAX_SPECULATIVE_TOKENS + 1), help="drafts per step to measure")
    ap.add_argument("--prompts", type=int, default=4, help="requests, run one at a time (default: 4)")
    ap.add_argument("--max-tokens", type=int, default=32, help="output tokens per request (default: 32)")
    args = ap.parse_args(argv)
    prompts = bench_prompts(args.prompts)
    kw = dict(model=args.model, device=args.device)
    off = run_speculative(prompts, args.max_tokens, 0, None, **kw)
    print(off.line(None), flush=True)
    oracle = ReplayDraft({tuple(p): o for p, o in zip(prompts, off.outputs)})
    runs = [off]
    for k in args.num_tokens:
        for name, drafter in (("mtp", None), ("oracle", oracle)):
            runs.append(run_speculative(prompts, args.max_tokens, k, drafter, source=name, **kw))
            print(runs[-1].line(off), flush=True)
    return runs


if __name__ == "__main__":
    main()
