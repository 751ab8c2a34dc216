"""Two checks of the decode-graph path that need no GPU, for the tests and the GPU-readiness bench.

* :func:`graph_replay_equals_eager`: a run of 64+ plain decode steps whose batch changes bucket, with a
  prefix hit, a preemption and requests that finish, served once eagerly and once through CUDA graphs
  captured and replayed by :mod:`atom.testing.graph_emulation`; the same tokens, and every step's
  logits within 1e-6 of the step's largest logit.
* :func:`index_widths_follow_context`: the decode step of a request with a 2,048-token context on
  engines of ``max_model_len`` 4,096 and 1,048,576 has the same index widths and dispatches the same
  ops on the same shapes (the graph path's inputs, ``padded`` mode).
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

__all__ = ["DecodeRun", "decode_run", "graph_replay_equals_eager", "index_widths_follow_context",
           "index_widths_and_shapes", "replay_engine", "replay_requests", "thin_model"]

WIDTH_CHECK_KV_BYTES = 1 << 28  # the arena of the width check: one request of 1M tokens fits
REPLAY_LEN = 128  # max_model_len of the replay run
REPLAY_CHUNKS = 13  # one-page chunks in the replay run's arena: tight enough that requests are preempted


def thin_model() -> DeepseekV4ForServing:
    """SWA, CSA and HCA layers, hash-routed layers and top-k routing at toy widths (random weights)."""
    cfg = DeepseekV4Config.tiny(n_mtp_layers=0, compress_ratios=(0, 4, 16, 4, 16, 4), vocab_size=1024)
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




def graph_replay_equals_eager(model: DeepseekV4ForServing | None = None) -> bool:
    """Whether :func:`decode_run` through emulated CUDA graphs samples the eager run's tokens with every
    step's logits within 1e-6 of the step's largest logit (``model``: :func:`thin_model` by default)."""
    model = thin_model() if model is None else model
    eager, graph = decode_run(model, "eager"), decode_run(model, "graph", emulate=True)
    return graph.tokens == eager.tokens and len(graph.logits) == len(eager.logits) and all(
        a.shape == b.shape and float((a - b).abs().max()) <= 1e-6 * float(b.abs().max())
        for a, b in zip(graph.logits, eager.logits))


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
