"""Two checks of the decode-graph path that need no GPU, for the tests and the GPU-readiness bench.

* :func:`graph_replay_equals_eager`: a run of 64+ plain decode steps whose batch changes bucket, with a
  prefix hit, a preemption and requests that finish, served through CUDA graphs captured and replayed by
  :mod:`atom.testing.graph_emulation`, eagerly on the same padded shapes (``padded`` mode), and eagerly
  unpadded; the replay equals the eager run on its shapes bit for bit, and samples the unpadded run's
  tokens with every step's logits within :data:`UNPADDED_BOUND` of the step's largest logit.
* :func:`index_widths_follow_context`: the decode step of a request with a 2,048-token context on
  engines of ``max_model_len`` 4,096 and 1,048,576 has the same index widths and dispatches the same
  ops on the same shapes (the graph path's inputs, ``padded`` mode).

Why eager at the replay's shapes: a padded step computes its real rows with other shapes than an
unpadded one, in two ways, and each changes the last bits. (1) More rows: a GEMM's result for one row
depends on how many rows it multiplies (MKL's fp32 GEMM on the CPU blocks the reduction by the row
count: ``linear(x[:3], w)`` differs from ``linear(x, w)[:3]`` by up to 5.7e-6 for ``x`` of 8 standard
normal rows of 64 and ``w`` of 64 x 64; cuBLAS picks its kernels by shape too). (2) Wider index lists: a
padded step's widths follow its context bucket (256 positions at least, ``max_model_len`` at most), an
unpadded step's its longest position, so a request's lists are widened with -1 entries by the step it
runs in. Measured on the replay run (:func:`thin_model`, 78 sampled steps): row padding alone 1.21e-6 of
the step's largest logit, widths alone 4.8e-7, both matched 0 (every step bit-equal); in absolute terms
the largest difference is 4.65e-6 (a step whose largest logit is 3.84), so with the default model
"logits within 1e-6" holds relative to the step's scale only.

Where the widths enter, traced op by op (every op's output recorded with a ``TorchDispatchMode`` in an
unpadded step and in the same step on the buffers of a bucket of its own size, same arena): the
attention reference's softmax denominator (``p.sum(-1)`` over the bucket's wider list), then, with that
removed, the indexer's scores (``q @ keys^T`` over 8 candidates against 32: MKL's fp32 GEMM changes
kernel below 16 columns, so a column's dot product rounds by the list's width); the attention logits
(``q @ keys^T`` again) and ``p @ V`` are GEMMs over the list as well. A batch-invariant model
(``DeepseekV4Config.batch_invariant``: token-local ops one row at a time, source (1) gone) therefore still
computed a request's attention differently in different company, until its attention references were
made to reduce over fixed key blocks (:mod:`atom.kernels.key_blocks`: every GEMM on blocks of one fixed
shape, block partials added in list order, trailing masked blocks exact zeros). With
``thin_model(batch_invariant=True)`` the replay run equals unpadded eager decode bit for bit: tokens and
every one of the 78 steps' logits (0.0; 4.37e-7 relative / 1.73e-6 absolute before the fixed blocks), so
:func:`compare_replay` on it meets the 1e-6 absolute bound (:data:`BATCH_INVARIANT_ABS_BOUND`). The
default model keeps the whole-list arithmetic (faster on the CPU) and its bounds above.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from atom.config import CacheConfig, SchedulerConfig
from atom.kv.block_manager import BlockManager
from atom.kv.kv_layout import KvLayout, plan_kv_layout
from atom.model_engine.llm_engine import LLMEngine
from atom.model_engine.scheduler import Scheduler
from atom.model_executor.model_runner import ModelRunner
from atom.models.deepseek_v4.checkpoint import random_state_dict
from atom.models.deepseek_v4.config import DeepseekV4Config
from atom.model_ops.step_inputs import StepInputs
from atom.models.deepseek_v4_serving import DeepseekV4ForServing
from atom.sampling_params import SamplingParams
from atom.output.request_output import RequestOutput
from atom.step_contract import RunnerOutput
from atom.testing.graph_emulation import cuda_graph_emulation

__all__ = ["BATCH_INVARIANT_ABS_BOUND", "DecodeRun", "ReplayComparison", "UNPADDED_ABS_BOUND", "UNPADDED_BOUND",
           "compare_replay", "decode_run", "graph_replay_equals_eager", "index_widths_follow_context",
           "index_widths_and_shapes", "replay_engine", "replay_requests", "thin_model"]

WIDTH_CHECK_KV_BYTES = 1 << 28  # the arena of the width check: one request of 1M tokens fits
REPLAY_LEN = 128  # max_model_len of the replay run
REPLAY_CHUNKS = 13  # one-page chunks in the replay run's arena: tight enough that requests are preempted
# replay vs unpadded eager, relative to the step's largest logit: the GEMMs' and reductions' last bits at
# other shapes (module docstring; measured 1.21e-6 with MKL's AVX-512 fp32 GEMM)
UNPADDED_BOUND = 2e-6
# the same difference in absolute terms (measured 4.65e-6 on logits up to 4.7 in magnitude)
UNPADDED_ABS_BOUND = 1e-5
# replay vs unpadded eager on a batch-invariant model, absolute (measured 0.0: bit-equal, module docstring)
BATCH_INVARIANT_ABS_BOUND = 1e-6


def thin_model(batch_invariant: bool = False) -> DeepseekV4ForServing:
    """SWA, CSA and HCA layers, hash-routed layers and top-k routing at toy widths (random weights, the same
    for both modes); ``batch_invariant``: token-local ops one row at a time and attention over fixed key
    blocks, so a request's logits do not depend on the step it runs in."""
    cfg = DeepseekV4Config.tiny(n_mtp_layers=0, compress_ratios=(0, 4, 16, 4, 16, 4), vocab_size=1024,
                                batch_invariant=batch_invariant)
    model = DeepseekV4ForServing(cfg)
    model.load_state_dict(random_state_dict(cfg, seed=3))
    return model.eval()


def _prompt(n: int, salt: int) -> list[int]:
    gen = torch.Generator().manual_seed(500 + salt)
    return torch.randint(1, 1000, (n,), generator=gen).tolist()


@dataclass
class DecodeRun:
    """What one run sampled: ``tokens`` per request (admission order), ``logits`` of every step as
    sampled, the bucket of every plain decode step (graph runs only), the most tokens a request took
    from the prefix cache, and the preemptions."""

    tokens: list[list[int]]
    logits: list[torch.Tensor] = field(repr=False)
    buckets: list[int]
    cached_tokens: int
    preemptions: int


def replay_engine(model_cfg: DeepseekV4Config, runner_for: Callable[[KvLayout], object],
                  chunks: int = REPLAY_CHUNKS) -> LLMEngine:
    """The replay run's engine: a tight arena of ``chunks`` chunks with prefix caching, up to 6 requests;
    ``runner_for(layout)`` builds the runner."""
    limits = SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=6, max_model_len=REPLAY_LEN)
    shape = CacheConfig(chunk_pages=1)  # small chunks: the arena's size is fine-grained
    layout = KvLayout.for_chunks(model_cfg.kv_spec("fp32", include_mtp=False), chunks, limits, shape)
    cache = CacheConfig(kv_cache_bytes=layout.kv_cache_bytes, enable_prefix_caching=True, chunk_pages=1)
    sched = Scheduler(limits, BlockManager(layout, cache), eos_token_id=None)
    return LLMEngine(sched, runner_for(layout), max_model_len=REPLAY_LEN)


def replay_requests(engine: LLMEngine) -> tuple[list[RequestOutput], int]:
    """Run the replay requests to the end: (their final outputs in admission order, the most prompt tokens
    one took from the prefix cache). Four greedy requests start together, one finishes early, one shares
    a 48-token prefix with the first and is added once that prefix is cached, one more arrives late."""
    shared = _prompt(48, 0)
    greedy = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in (70, 8, 60, 50, 40, 30)]
    ids = [engine.add_request(p, g) for p, g in zip((shared + _prompt(5, 1), _prompt(21, 2), _prompt(17, 3),
                                                      _prompt(9, 4)), greedy)]
    final: dict[str, RequestOutput] = {}
    steps = 0
    while engine.has_unfinished_requests():
        final.update((out.request_id, out) for out in engine.step() if out.finished)
        steps += 1
        if steps == 12:  # the first request's prompt blocks are published by now
            ids.append(engine.add_request(shared + _prompt(7, 5), greedy[4]))
        if steps == 30:
            ids.append(engine.add_request(_prompt(13, 6), greedy[5]))
    return [final[rid] for rid in ids], max(out.num_cached_tokens for out in final.values())


def decode_run(model: DeepseekV4ForServing, graph_mode: str, *, emulate: bool = False) -> DecodeRun:
    """:func:`replay_requests` on the runner of ``graph_mode`` (arena NaN-poisoned); ``emulate``:
    ``torch.cuda``'s graph API is emulated on the CPU, so ``graph_mode='graph'`` captures and replays there."""
    logits, buckets, runners = [], [], []

    def runner_for(layout: KvLayout) -> ModelRunner:
        runner = ModelRunner(model, layout, max_model_len=REPLAY_LEN, kernel_backend="torch", graph_mode=graph_mode,
                             poison=True)
        sample_all = runner.sampler.sample_all
        runner.sampler.sample_all = lambda rows, *a, **k: logits.append(rows.clone()) or sample_all(rows, *a, **k)
        if runner.decode is not None:
            run = runner.decode.run
            runner.decode.run = lambda batch, tables: buckets.append(runner.decode.buffers.bucket_for(batch)) or \
                run(batch, tables)
        runners.append(runner)
        return runner

    with cuda_graph_emulation() if emulate else contextlib.nullcontext():
        engine = replay_engine(model.cfg, runner_for)
        outputs, cached = replay_requests(engine)
    return DecodeRun([out.output_token_ids for out in outputs], logits, [b for b in buckets if b is not None],
                     cached, engine.scheduler.num_preemptions)


@dataclass(frozen=True)
class ReplayComparison:
    """The replay run against the eager runs: ``same_shapes``: its tokens and every step's logits equal
    the ``padded`` run's bit for bit; ``tokens_equal``: its tokens equal the unpadded eager run's;
    ``unpadded``: the largest logit difference from that run, relative to the step's largest logit;
    ``unpadded_abs``: the same difference in absolute terms."""

    same_shapes: bool
    tokens_equal: bool
    unpadded: float
    unpadded_abs: float = float("inf")

    @property
    def equal(self) -> bool:
        return self.same_shapes and self.tokens_equal and self.unpadded <= UNPADDED_BOUND


def compare_replay(model: DeepseekV4ForServing | None = None) -> ReplayComparison:
    """:func:`decode_run` through emulated CUDA graphs against the ``padded`` and ``eager`` runs
    (``model``: :func:`thin_model` by default)."""
    model = thin_model() if model is None else model
    graph = decode_run(model, "graph", emulate=True)
    return compare_runs(graph, decode_run(model, "padded"), decode_run(model, "eager"))


def compare_runs(graph, padded, eager) -> ReplayComparison:
    """A replayed run against the same steps run ``padded`` and unpadded ``eager`` (any runs with ``tokens``
    and per-step ``logits``); ``unpadded`` is infinite when the eager run's steps do not line up."""
    same = graph.tokens == padded.tokens and len(graph.logits) == len(padded.logits) and all(
        torch.equal(a, b) for a, b in zip(graph.logits, padded.logits))
    worst = worst_abs = float("inf")
    if len(graph.logits) == len(eager.logits) and all(a.shape == b.shape for a, b in zip(graph.logits, eager.logits)):
        worst = max(float((a - b).abs().max()) / float(b.abs().max()) for a, b in zip(graph.logits, eager.logits))
        worst_abs = max(float((a - b).abs().max()) for a, b in zip(graph.logits, eager.logits))
    return ReplayComparison(same, graph.tokens == eager.tokens, worst, worst_abs)


def graph_replay_equals_eager(model: DeepseekV4ForServing | None = None) -> bool:
    """Whether decode steps replayed from emulated CUDA graphs compute what eager decode computes: bit for
    bit on the same padded shapes, and the unpadded run's tokens with logits within
    :data:`UNPADDED_BOUND` (:func:`compare_replay`)."""
    return compare_replay(model).equal


class _ShapeRecorder(TorchDispatchMode):
    """Every op dispatched, with the shapes of its tensor outputs."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[str, tuple]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.ops.append((str(func), tuple(tuple(o.shape) for o in tree_flatten(out)[0] if isinstance(o, torch.Tensor))))
        return out


def index_widths_and_shapes(model: DeepseekV4ForServing, max_model_len: int, context: int = 2048,
                            graph_mode: str = "padded") -> tuple[dict[int, int], list[tuple[str, tuple]]]:
    """(index width per compress ratio, every op of the forward with its output shapes) of the decode step
    of one request whose context reaches ``context`` tokens, on an engine of ``max_model_len``. The
    prefill is scheduled and its tables applied but not computed (an op's shapes never depend on values:
    the forward reads none back), so the decode step runs on real page tables over an arena of garbage.
    Recorded: the model's forward (not the table updates, whose rows are ``max_model_len`` wide)."""
    limits = SchedulerConfig(max_num_batched_tokens=context, max_num_seqs=2, max_model_len=max_model_len)
    cache = CacheConfig(kv_cache_bytes=WIDTH_CHECK_KV_BYTES, enable_prefix_caching=False)
    layout = plan_kv_layout(model.cfg.kv_spec("fp32", include_mtp=False), cache, limits)
    sched = Scheduler(limits, BlockManager(layout, cache), eos_token_id=None)
    runner = ModelRunner(model, layout, max_model_len=max_model_len, kernel_backend="torch", graph_mode=graph_mode)
    engine = LLMEngine(sched, runner, max_model_len=max_model_len)
    engine.add_request(_prompt(context - 1, 7), SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))
    prefill = sched.schedule()
    runner.tables.apply(prefill)
    sched.postprocess(prefill, RunnerOutput({prefill.seqs[0].seq_id: 1}))
    decode = sched.schedule()
    assert [(s.start_pos, s.num_tokens) for s in decode.seqs] == [(context - 1, 1)], "not one decode token"
    steps, inner, rec = [], runner._forward, _ShapeRecorder()

    def recorded(step: StepInputs) -> tuple[torch.Tensor, torch.Tensor]:
        steps.append(step)
        with rec:
            return inner(step)

    runner._forward = recorded
    runner.execute(decode)
    runner._forward = inner
    ratios = sorted(set(model.cfg.compress_ratios) - {0})
    return {r: steps[-1].index_width(r) for r in ratios}, rec.ops


def index_widths_follow_context(model: DeepseekV4ForServing | None = None) -> bool:
    """Whether a decode step at a 2,048-token context has the same index widths (``2048 // ratio``) and the
    same ops on the same shapes at ``max_model_len`` 4,096 and 1,048,576 (``model``: :func:`thin_model`)."""
    model = thin_model() if model is None else model
    index_widths_and_shapes(model, 4096, context=64)  # the first forward stacks the experts' weights once
    short, long = index_widths_and_shapes(model, 4096), index_widths_and_shapes(model, 1 << 20)
    return short == long and short[0] == {r: 2048 // r for r in short[0]}
