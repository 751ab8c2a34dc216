"""The data-parallel runner in other layouts: 2 replicas of 2 tensor-parallel ranks (4 gloo ranks, the
experts partitioned or split over all 4), and 2 replicas of 1 rank on the quantized tiny checkpoints;
each replica's steps give its batches' single-rank logits within 1e-5 relative."""

from __future__ import annotations

import dataclasses
import io

import pytest
import torch

from atom.config import ParallelConfig
from atom.models.deepseek_v4.make_tiny_checkpoint import make_tiny_checkpoint
from atom.parallel.dp_runner import start_data_parallel_runner
from support.dp_lockstep import (DECODE, PROMPTS, add_requests, check_steps, engine_config, lockstep, rank_spec,
                                 scheduler_for, single_rank_steps)

pytestmark = pytest.mark.slow


def run_replicas(spec, model_dir, par) -> tuple[list[list], int, str]:
    """``(per replica its steps, padding steps, start-up report)`` of both replicas' :data:`PROMPTS`."""
    out = io.StringIO()
    runner = start_data_parallel_runner(spec, keep_logits=True, out=out)
    try:
        schedulers = [scheduler_for(engine_config(model_dir, par)) for _ in range(2)]
        for s, prompts, decode in zip(schedulers, PROMPTS, DECODE):
            add_requests(s, prompts, decode)
        logs = lockstep(runner.execute_all, schedulers)
    finally:
        runner.close()
    return logs, runner.padding_steps, out.getvalue()


@pytest.fixture(scope="module")
def single_rank(tiny_dir):
    torch.set_num_threads(1)
    return single_rank_steps(tiny_dir)


@pytest.mark.parametrize("expert_parallel", [True, False], ids=["expert-parallel", "tp-experts"])
def test_two_replicas_of_two_tensor_parallel_ranks_give_each_batch_its_single_rank_logits(
        tiny_dir, single_rank, expert_parallel):
    par = ParallelConfig(2, data_parallel_size=2, enable_expert_parallel=expert_parallel)
    logs, padding_steps, report = run_replicas(rank_spec(tiny_dir, par), tiny_dir, par)
    assert "replica 1: ranks 2..3" in report
    for got, want in zip(logs, single_rank):
        check_steps(got, want)
    assert padding_steps >= 4  # replica 0 (ranks 0 and 1) padded while replica 1 decoded on


@pytest.mark.parametrize("formats", ["fp8", "fp8+fp4"])
def test_replicas_on_a_quantized_checkpoint_give_each_batch_its_single_rank_logits(tmp_path, formats):
    """FP8 experts split over both ranks; FP8 + MXFP4 experts partitioned whole (their 32-wide inputs cannot
    be split at 2 ranks); ``quant_sim`` off on both sides."""
    torch.set_num_threads(1)
    model_dir = make_tiny_checkpoint(tmp_path / formats, fp8=True, fp4_experts=formats == "fp8+fp4")
    want = single_rank_steps(model_dir, quant_sim=False)
    par = ParallelConfig(1, data_parallel_size=2, enable_expert_parallel=formats == "fp8+fp4")
    spec = dataclasses.replace(rank_spec(model_dir, par), quant_sim=False)
    logs, _, _ = run_replicas(spec, model_dir, par)
    for got, w in zip(logs, want):
        check_steps(got, w)
