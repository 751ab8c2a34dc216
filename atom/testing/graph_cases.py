"""The decode-graph cases beyond the plain dense decode step, run through the CPU emulation of capture and replay.

Each case runs one short scenario three times on the same model: with decode steps captured and replayed from
emulated CUDA graphs (``graph``), eagerly on the same bucketed inputs (``padded``) and eagerly unpadded
(``eager``), and :func:`~atom.testing.graph_checks.compare_runs` checks the replay against both. The scenario (:func:`short_run`): four greedy
requests of different lengths and output counts, so the decode batch shrinks 4 -> 3 -> 2 -> 1 and changes
bucket (4, 2, 1); every step's sampled logits are kept.

The cases: release-format MoE (FP8 linears, MXFP4 routed experts, ``quant_sim`` on) on one rank; the MTP verify
step of speculative decoding (``speculative`` > 0: every decoding request verifies its drafts in the bucketed
step, a request with fewer drafts padded to the runner's count); tensor- and expert-parallel ranks (:mod:`atom.testing.graph_ranks`). On the torch backend the
quantized or partitioned routed experts run ``fused_moe``'s grouped reference in all three runs
(``host_free_experts``), so the runs differ only by padding: rows and index widths.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from atom.config import CacheConfig, SchedulerConfig
from atom.kv.block_manager import BlockManager
from atom.kv.kv_layout import KvLayout
from atom.model_engine.llm_engine import LLMEngine
from atom.model_engine.scheduler import Scheduler
from atom.model_executor.model_runner import ModelRunner
from atom.models.deepseek_v4_serving import DeepseekV4ForServing
from atom.sampling_params import SamplingParams
from atom.spec_decode.draft_source import RunnerDrafts
from atom.testing.graph_checks import ReplayComparison, compare_runs
from atom.testing.graph_emulation import cuda_graph_emulation

__all__ = ["CaseRun", "SHORT_LEN", "mtp_model", "release_model", "run_case",
           "short_run", "short_engine"]

SHORT_LEN = 128  # max_model_len of the short scenario
PROMPT_LENS = (9, 14, 20, 5)
OUTPUTS = (12, 8, 5, 3)  # decode batches of 4, 3, 2 and 1 requests


def release_model(directory: str | Path, device: str = "cpu") -> DeepseekV4ForServing:
    """The tiny model in the release format (FP8 linears, MXFP4 routed experts) written to ``directory``, loaded
    quantized on ``device`` with ``quant_sim`` on (the FP8 round trip of every quantized GEMM's input), without
    its MTP layer."""
    from atom.models.deepseek_v4.loader import load_checkpoint
    from atom.models.deepseek_v4.make_tiny_checkpoint import make_tiny_checkpoint

    path = make_tiny_checkpoint(directory, fp8=True, fp4_experts=True)
    return load_checkpoint(path, quant_sim=True, load_mtp=False, device=device, model_class=DeepseekV4ForServing)


def mtp_model() -> DeepseekV4ForServing:
    """The tiny preset with its MTP layer (random weights), for speculative decoding."""
    from atom.models.deepseek_v4.checkpoint import random_state_dict
    from atom.models.deepseek_v4.config import DeepseekV4Config

    cfg = DeepseekV4Config.tiny()
    model = DeepseekV4ForServing(cfg)
    model.load_state_dict(random_state_dict(cfg, seed=5))
    return model.eval()


@dataclass
class CaseRun:
    """What one run sampled: ``tokens`` per request (admission order), the ``logits`` of every step as sampled,
    the bucket of every step run on the bucketed inputs, the drafts accepted (speculative runs), and how many
    bucketed steps padded a request's missing drafts (it had fewer than the runner verifies)."""

    tokens: list[list[int]]
    logits: list[torch.Tensor] = field(repr=False)
    buckets: list[int]
    accepted: int = 0
    padded_drafts: int = 0


def short_engine(model_cfg, runner: Callable[[KvLayout], object], *, speculative: int = 0) -> LLMEngine:
    """The short scenario's engine: a roomy arena, no prefix caching, up to 4 requests; ``speculative`` drafts
    per decoding request proposed by the runner's MTP layer."""
    limits = SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=4, max_model_len=SHORT_LEN,
                             speculative_num_tokens=speculative)
    layout = KvLayout.for_chunks(model_cfg.kv_spec("fp32", include_mtp=speculative > 0), 64, limits, CacheConfig())
    cache = CacheConfig(kv_cache_bytes=layout.kv_cache_bytes, enable_prefix_caching=False)
    sched = Scheduler(limits, BlockManager(layout, cache, mtp_rows=speculative > 0), eos_token_id=None,
                      drafter=RunnerDrafts() if speculative else None)
    return LLMEngine(sched, runner(layout), max_model_len=SHORT_LEN)


def _prompt(n: int, salt: int) -> list[int]:
    gen = torch.Generator().manual_seed(900 + salt)
    return torch.randint(1, 500, (n,), generator=gen).tolist()


def run_requests(engine: LLMEngine) -> list[list[int]]:
    """The short scenario's requests run to the end: their output tokens in admission order."""
    ids = [engine.add_request(_prompt(n, i), SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True))
           for i, (n, m) in enumerate(zip(PROMPT_LENS, OUTPUTS))]
    final = {}
    while engine.has_unfinished_requests():
        final.update((out.request_id, out) for out in engine.step() if out.finished)
    return [final[rid].output_token_ids for rid in ids]


def recording_runner(runner: ModelRunner, logits: list[torch.Tensor], buckets: list[int],
                     padded: list[bool] | None = None) -> ModelRunner:
    """``runner`` with every step's sampled logits appended to ``logits``, the bucket of every step it runs
    on the bucketed inputs to ``buckets`` and whether that step padded a request's missing drafts to
    ``padded``."""
    padded = [] if padded is None else padded
    sample_all = runner.sampler.sample_all
    runner.sampler.sample_all = lambda rows, *a, **k: logits.append(rows.clone()) or sample_all(rows, *a, **k)
    if runner.decode is not None:
        run = runner.decode.run

        def bucketed(batch, tables):
            out = run(batch, tables)
            if out is not None:
                buckets.append(runner.decode.buffers.bucket_for(batch))
                padded.append(runner.decode.buffers.padded_drafts(batch))
            return out
        runner.decode.run = bucketed
    return runner


def short_run(model: DeepseekV4ForServing, graph_mode: str, *, emulate: bool = False, speculative: int = 0,
              host_free_experts: bool = True, kernel_backend: str = "torch") -> CaseRun:
    """The short scenario on a runner of ``graph_mode`` over ``model`` (arena NaN-poisoned); ``emulate``:
    ``torch.cuda``'s graph API emulated on the CPU, so ``graph`` captures and replays there."""
    logits: list[torch.Tensor] = []
    buckets: list[int] = []
    padded: list[bool] = []

    def runner_for(layout: KvLayout) -> ModelRunner:
        return recording_runner(ModelRunner(model, layout, max_model_len=SHORT_LEN, kernel_backend=kernel_backend,
                                            graph_mode=graph_mode, poison=True, speculative_num_tokens=speculative,
                                            host_free_experts=host_free_experts), logits, buckets, padded)

    with cuda_graph_emulation() if emulate else contextlib.nullcontext(), torch.no_grad():
        engine = short_engine(model.cfg, runner_for, speculative=speculative)
        tokens = run_requests(engine)
    return CaseRun(tokens, logits, buckets, engine.stats().spec_accepted if speculative else 0, sum(padded))


def run_case(model: DeepseekV4ForServing, **kwargs) -> tuple[dict[str, CaseRun], ReplayComparison]:
    """The three runs of the short scenario on ``model`` (``kwargs``: :func:`short_run`'s) and their comparison."""
    runs = {"graph": short_run(model, "graph", emulate=True, **kwargs), "padded": short_run(model, "padded", **kwargs),
            "eager": short_run(model, "eager", **kwargs)}
    return runs, compare_runs(runs["graph"], runs["padded"], runs["eager"])
