"""Forward-step benchmark: aten ops per layer, host syncs and wall time of one engine step.

    python -m atom.bench.forward [--quick] [--models flash,pro] [--threads N]

Builds "thin" DeepSeek-V4 models: the real structure of V4-Flash / V4-Pro (layer count and compress
ratios, routed experts and top-6, hash-routed first 3 layers, window 128, index top-k, query and
indexer head counts, mHC with 20 Sinkhorn iterations) with small widths, random weights. For each
model it runs the paged engine (torch kernels) and measures:

* decode at batch 1 / 8 / 32 / 128 (every request holds ``--context`` tokens), and
* one prefill chunk of ``--prefill`` tokens (a single request),

printing per case the aten ops per layer, the estimated GPU kernel launches per layer (views launch
nothing, a kernel op of :mod:`atom.kernels` is one launch however many ops its torch reference runs;
:attr:`~atom.bench.op_count.OpCounter.launches`) and the host syncs (``item``/``nonzero``/``tolist``)
inside the model forward, and the wall ms of the whole step (``ModelRunner.execute``: inputs,
forward, sampling; median of ``--repeats``). The same figures follow for the reference model on the
same weights (its per-sequence ``forward_batch``; one run), unless ``--no-reference``: the reference
decodes each request separately over its whole cache and takes minutes at batch 32 on a CPU.

``--quick`` shrinks the run for a shared CPU: batches 1 / 8 / 32, context 160, prefill 256 and 512.
The last line is ``ops_per_layer_b1=<int> ops_per_layer_b32=<int> host_syncs=<int>
decode_ms_b32=<float>`` for the thin-Flash decode (host syncs: the most in any decode batch).

``--kernels`` (run with ``TRITON_INTERPRET=1``) instead counts the device kernels per layer of thin Flash on
the Triton backend (:mod:`atom.bench.kernel_count`: Triton launches plus aten ops that launch device work;
views, allocations and metadata excluded) for decode at batch 1 and 32 and a 64-token prefill chunk (the
decode cases' context is filled on the torch backend; only the counted step runs on Triton, whose launches
are counted without running their programs unless ``--run-triton``); its
last line is ``kernels_per_layer_b1=<int> kernels_per_layer_b32=<int> kernels_per_layer_prefill64=<int>``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Callable

import torch

from atom.bench.op_count import OpCounter
from atom.config import CacheConfig, SchedulerConfig
from atom.kernels.backend import load_kernels
from atom.kv.block_manager import BlockManager
from atom.kv.kv_layout import plan_kv_layout
from atom.model_engine.llm_engine import LLMEngine
from atom.model_engine.scheduler import Scheduler
from atom.model_executor.model_runner import ModelRunner
from atom.models.deepseek_v4.checkpoint import random_state_dict
from atom.models.deepseek_v4.config import DeepseekV4Config
from atom.models.deepseek_v4.model import DeepseekV4Model, ModelWeights
from atom.models.deepseek_v4_serving import DeepseekV4ForServing
from atom.sampling_params import SamplingParams

VOCAB = 1024
GREEDY = SamplingParams(max_tokens=1024, temperature=0.0, ignore_eos=True)  # never ends during a case


def thin_config(kind: str) -> DeepseekV4Config:
    """The thin Flash or Pro model: real layer structure and counts, small widths."""
    if kind == "flash":
        ratios, layers, experts, heads, topk, groups = (0, 0) + (4, 128) * 20 + (4,), 43, 256, 64, 512, 8
    elif kind == "pro":
        ratios, layers, experts, heads, topk, groups = (128, 128) + (4, 128) * 29 + (4,), 61, 384, 128, 1024, 16
    else:
        raise ValueError(f"unknown thin model {kind!r}; accepted: flash, pro")
    return DeepseekV4Config(
        vocab_size=VOCAB, dim=32, moe_inter_dim=16, n_layers=layers, n_hash_layers=3, n_mtp_layers=0,
        n_heads=heads, n_routed_experts=experts, n_shared_experts=1, n_activated_experts=6,
        score_func="sqrtsoftplus", route_scale=1.5, swiglu_limit=10.0, head_dim=32, rope_head_dim=8,
        o_groups=groups, o_lora_rank=8, q_lora_rank=16, window_size=128, compress_ratios=ratios,
        compress_rope_theta=160000.0, rope_theta=10000.0, index_n_heads=64, index_head_dim=16, index_topk=topk,
        hc_mult=4, hc_sinkhorn_iters=20, original_seq_len=65536, rope_factor=16.0)


def thin_model(kind: str, model_class: type[ModelWeights] = DeepseekV4ForServing) -> ModelWeights:
    """The thin ``kind`` model with random weights (seed 0): the serving model by default, or the reference
    (``model_class=DeepseekV4Model``) on the same weights."""
    cfg = thin_config(kind)
    model = model_class(cfg)
    model.load_state_dict(random_state_dict(cfg, seed=0))
    return model.eval()


def make_engine(model: DeepseekV4ForServing, max_seqs: int, max_model_len: int, budget: int,
                backend: str = "torch") -> LLMEngine:
    cache = CacheConfig(kv_cache_bytes=1 << 30, enable_prefix_caching=False)
    limits = SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=max_seqs, max_model_len=max_model_len)
    layout = plan_kv_layout(model.cfg.kv_spec("fp32", include_mtp=False), cache, limits)
    sched = Scheduler(limits, BlockManager(layout, cache), eos_token_id=None)
    runner = ModelRunner(model, layout, max_model_len=max_model_len, kernel_backend=backend)
    return LLMEngine(sched, runner, max_model_len=max_model_len)


def prompt(n: int, salt: int) -> list[int]:
    gen = torch.Generator().manual_seed(1000 + salt)
    return torch.randint(1, VOCAB, (n,), generator=gen).tolist()


def count(fn: Callable[[], object]) -> OpCounter:
    with OpCounter() as c:
        fn()
    return c


def timed(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def measured_step(model: DeepseekV4ForServing, prompts: list[list[int]], decode: bool,
                  backend: str = "torch", one_prefill: bool = False,
                  fill_backend: str | None = None) -> tuple[ModelRunner, object]:
    """``(runner, batch)``: an engine on ``backend`` with ``prompts`` added and the step that decodes every
    request (``decode``) or the first (prefill) step scheduled, ready to run with ``runner.execute``.
    ``one_prefill``: the token budget takes every prompt at once, so the decode is reached after one step.
    ``fill_backend``: the steps before the measured one (the prefill of a decode case) run on this backend
    instead, and the model is then bound to ``backend`` on the same arena: every backend writes KV rows of the
    same layout and values (to rounding: the kernel tests hold each Triton kernel to its torch reference), and a
    step's launches follow the batch's shapes, never the values it reads, so the measured step runs what it
    would have run, without the interpreter running the whole prefill first."""
    longest = max(map(len, prompts))
    budget = sum(map(len, prompts)) if one_prefill else max(longest, len(prompts))
    engine = make_engine(model, len(prompts), longest + GREEDY.max_tokens, budget, fill_backend or backend)
    for p in prompts:
        engine.add_request(p, GREEDY)
    sched, runner = engine.scheduler, engine.runner
    while decode and (sched.waiting or any(s.in_prefill for s in sched.running)):
        engine.step()  # prefill every request, so that the next batch decodes all of them
    if fill_backend is not None and fill_backend != backend:
        runner.kernels = load_kernels(backend)
        model.bind_arena(runner.views, runner.kernels)
    batch = sched.schedule()  # the step measured: run below by the runner alone, repeatedly
    if decode and not (len(batch.seqs) == len(prompts) and all(s.num_tokens == 1 for s in batch.seqs)):
        raise RuntimeError("the requests finished before all of them were decoding together")
    return runner, batch


def counted_forward(runner: ModelRunner, batch: object, counter_class: type) -> tuple[object, object]:
    """``(counter, output)`` of ``runner.execute(batch)``: the counter (``counter_class()``) that was active
    around the model forward (inputs and sampling are outside it) and what the step returned."""
    inner, seen = runner._forward, []

    def counted(step):
        with counter_class() as c:
            out = inner(step)
        seen.append(c)
        return out

    runner._forward = counted
    try:
        output = runner.execute(batch)
    finally:
        runner._forward = inner
    return seen[0], output


def engine_step(model: DeepseekV4ForServing, prompts: list[list[int]], repeats: int,
                decode: bool) -> tuple[int, int, int, float]:
    """(aten ops, estimated launches and host syncs in the forward, wall ms of the step) for the step that
    decodes every request (``decode``) or for the first (prefill) step."""
    runner, batch = measured_step(model, prompts, decode)
    c, _ = counted_forward(runner, batch, OpCounter)
    ms = timed(lambda: runner.execute(batch), repeats)  # a decode/prefill step re-run writes the same rows
    return c.total, c.launches, c.syncs, ms


def reference_step(model: DeepseekV4Model, prompts: list[list[int]], decode: bool) -> tuple[int, int, float]:
    """The same figures for the reference model (per-sequence caches, ``forward_batch``), one run."""
    caches = [model.new_cache(len(p) + 2) for p in prompts]
    if decode:
        for c, p in zip(caches, prompts):
            model.prefill(c, torch.tensor(p[:-1]))
        chunks = [torch.tensor(p[-1:]) for p in prompts]
        starts = [len(p) - 1 for p in prompts]
    else:
        chunks, starts = [torch.tensor(p) for p in prompts], [0] * len(prompts)
    t0 = time.perf_counter()
    c = count(lambda: model.forward_batch(caches, chunks, starts))
    ms = (time.perf_counter() - t0) * 1e3
    return c.total, c.syncs, ms


def report(kind: str, batches: tuple[int, ...], context: int, prefills: tuple[int, ...], repeats: int,
           reference: bool) -> dict[int, tuple[int, int, float]]:
    model = thin_model(kind)
    ref_model = thin_model(kind, DeepseekV4Model) if reference else None
    n = model.cfg.n_layers
    print(f"thin {kind}: {n} layers, {model.cfg.n_routed_experts} experts, ratios "
          f"{sorted(set(model.cfg.compress_ratios))}")
    print(f"{'case':>14} | {'engine ops/layer':>16} {'launches/layer':>14} {'syncs':>6} {'ms/step':>9} | "
          f"{'ref ops/layer':>13} {'syncs':>6} {'ms/step':>9}")
    decode: dict[int, tuple[int, int, float]] = {}
    cases = [(f"decode b{b}", [prompt(context, i) for i in range(b)], True) for b in batches]
    cases += [(f"prefill {t}", [prompt(t, 0)], False) for t in prefills]
    for name, prompts, is_decode in cases:
        ops, launches, syncs, ms = engine_step(model, prompts, repeats, is_decode)
        ref = "-" if ref_model is None else "{:>13} {:>6} {:>9.1f}".format(
            *_per_layer(reference_step(ref_model, prompts, is_decode), n))
        print(f"{name:>14} | {ops // n:>16} {launches // n:>14} {syncs:>6} {ms:>9.1f} | {ref}", flush=True)
        if is_decode:
            decode[len(prompts)] = (ops // n, syncs, ms)
    return decode


def kernel_counts(kind: str, context: int, prefill: int, run_triton: bool = False) -> dict[str, int]:
    """Device kernels per layer (:class:`~atom.bench.kernel_count.KernelCounter`: Triton launches plus aten ops
    that launch device work) in the model forward on the Triton backend, for decode at batch 1 and 32 and one
    prefill chunk of ``prefill`` tokens. Needs ``TRITON_INTERPRET=1`` on a CPU.

    Only the counted step runs on the Triton backend: a decode case's prefill fills the cache on the torch
    backend (``measured_step``'s ``fill_backend``), which writes the same KV rows to rounding (the launches of
    a step do not depend on the values), so the interpreter runs one step per case instead of the whole
    prefill first (over 36 minutes at batch 32 on a shared 2-core machine). The Triton launches of the step
    are counted without running their programs unless ``run_triton`` (``KernelCounter(run_triton=False)``:
    the forward reads nothing back, so the same ops run; running them takes tens of minutes at batch 32)."""
    from atom.bench.kernel_count import KernelCounter

    model = thin_model(kind)
    n = model.cfg.n_layers
    cases = {"b1": ([prompt(context, 0)], True), "b32": ([prompt(context, i) for i in range(32)], True),
             f"prefill{prefill}": ([prompt(prefill, 0)], False)}
    counts = {}
    for name, (prompts, decode) in cases.items():
        runner, batch = measured_step(model, prompts, decode, backend="triton", one_prefill=True,
                                      fill_backend="torch")
        for block in model.layers:  # the experts are stacked once per model, at its first fused forward: not
            block.ffn.expert_stack()  # a cost of the step (the torch backend's prefill did not stack them)
        c, _ = counted_forward(runner, batch, lambda: KernelCounter(run_triton=run_triton))
        counts[name] = c.total // n
        top = ", ".join(f"{op} {k // n}" for op, k in c.aten.most_common(6))
        print(f"{name:>12}: {c.total // n} kernels per layer ({c.triton // n} Triton launches; aten: {top})",
              flush=True)
    return counts


def _per_layer(figures: tuple[int, int, float], n: int) -> tuple[int, int, float]:
    ops, syncs, ms = figures
    return ops // n, syncs, ms


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="batches 1/8/32, context 160, prefill 256 and 512")
    ap.add_argument("--models", default="flash,pro", help="comma-separated: flash, pro (default both)")
    ap.add_argument("--context", type=int, default=None, help="tokens each decoding request holds")
    ap.add_argument("--repeats", type=int, default=3, help="timed re-runs of each engine step (median)")
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0 = torch's default)")
    ap.add_argument("--kernels", action="store_true",
                    help="only count device kernels per layer on the Triton backend (run with TRITON_INTERPRET=1)")
    ap.add_argument("--run-triton", action="store_true",
                    help="with --kernels: run the counted Triton launches in the interpreter too (slow; the count "
                         "is the same, since the forward reads no device value back)")
    ap.add_argument("--reference", action=argparse.BooleanOptionalAction, default=True,
                    help="also run the reference model on each case (default: on)")
    args = ap.parse_args(argv)
    kinds = [k.strip() for k in args.models.split(",") if k.strip()]
    bad = [k for k in kinds if k not in ("flash", "pro")]
    if bad or "flash" not in kinds:
        raise SystemExit(f"--models {args.models!r}: accepted names are flash and pro, and flash is required")
    if args.repeats < 1 or (args.context is not None and args.context < 2):
        raise SystemExit("--repeats must be >= 1 and --context >= 2")
    if args.threads:
        torch.set_num_threads(args.threads)
    batches, context, prefills = ((1, 8, 32), 160, (256, 512)) if args.quick else ((1, 8, 32, 128), 512, (2048,))
    context = args.context or context
    if args.kernels:
        print(f"thin flash, Triton backend (interpreter), context {context} tokens")
        with torch.no_grad():
            counts = kernel_counts("flash", context, 64, run_triton=args.run_triton)
        print(f"kernels_per_layer_b1={counts['b1']} kernels_per_layer_b32={counts['b32']} "
              f"kernels_per_layer_prefill64={counts['prefill64']}")
        return
    print(f"context {context} tokens, torch kernels, {torch.get_num_threads()} threads")
    flash = None
    with torch.no_grad():
        for kind in kinds:
            result = report(kind, batches, context, prefills, args.repeats, args.reference)
            flash = result if kind == "flash" else flash
    b1, b32 = flash[1], flash[32]
    syncs = max(v[1] for v in flash.values())
    print(f"ops_per_layer_b1={b1[0]} ops_per_layer_b32={b32[0]} host_syncs={syncs} decode_ms_b32={b32[2]:.1f}")


if __name__ == "__main__":
    main()
