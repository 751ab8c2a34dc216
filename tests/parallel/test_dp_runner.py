"""Data-parallel attention over 2 gloo ranks (2 replicas of 1 rank; experts partitioned or split over
both): each replica runs its own requests, and every step's logits equal one rank running those
requests alone, within 1e-5 relative (chunked prefill and decode); a replica left idle runs padding
steps (counted) while the other runs, in both directions, without a hang. The same over 4 ranks: 2
replicas of 2 tensor-parallel ranks, the experts over all 4; and on quantized checkpoints.

Rank 0 is this process; ``start_data_parallel_runner`` spawns rank 1."""

from __future__ import annotations

import dataclasses
import io

import pytest
import torch

from atom.config import ParallelConfig
from atom.engine_builder import build_engine
from atom.models.deepseek_v4.make_tiny_checkpoint import make_tiny_checkpoint
from atom.parallel.dp_runner import PADDING_ROWS, start_data_parallel_runner
from support.dp_lockstep import (PROMPTS, add_requests, engine_config, lockstep, rank_spec, release_all,
                                 scheduler_for)

pytestmark = pytest.mark.slow

MODES = {"expert-parallel": True, "tp-experts": False}
DECODE = (4, 9)  # tokens each replica's requests decode: replica 1 runs on after replica 0 is done


@pytest.fixture(scope="module")
def single_rank(tiny_dir):
    """Per replica's prompts, the steps one rank runs for them alone."""
    torch.set_num_threads(1)
    logs = []
    for prompts, decode in zip(PROMPTS, DECODE):
        config = engine_config(tiny_dir, ParallelConfig())
        runner = build_engine(config, keep_logits=True, poison=True).runner
        scheduler = scheduler_for(config)
        add_requests(scheduler, prompts, decode)
        logs.append(lockstep(lambda batches: [runner.execute(batches[0])], [scheduler])[0])
    return logs


@pytest.fixture(scope="module", params=list(MODES))
def dp(request, tiny_dir):
    par = ParallelConfig(1, data_parallel_size=2, enable_expert_parallel=MODES[request.param])
    out = io.StringIO()
    runner = start_data_parallel_runner(rank_spec(tiny_dir, par), keep_logits=True, out=out)
    yield runner, par, out.getvalue()
    runner.close()


def check_steps(got: list, want: list) -> None:
    assert [s[:2] for s in got] == [s[:2] for s in want]
    for (*_, g), (*_, w) in zip(got, want):
        assert not torch.isnan(g).any()
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5 * float(w.abs().max()))


def test_two_replicas_running_different_batches_give_each_batch_its_single_rank_logits(tiny_dir, dp, single_rank):
    runner, par, report = dp
    assert runner.replicas == 2
    assert "replica 0: ranks 0..0" in report and "replica 1: ranks 1..1" in report
    schedulers = [scheduler_for(engine_config(tiny_dir, par)) for _ in range(2)]
    for s, prompts, decode in zip(schedulers, PROMPTS, DECODE):
        add_requests(s, prompts, decode)
    before, pads = runner.padding_steps, []

    def counted(batches):
        pads.append(sum(b is None or not b.seqs for b in batches))
        return runner.execute_all(batches)

    logs = lockstep(counted, schedulers)
    release_all(runner.execute_all, schedulers)
    for got, want in zip(logs, single_rank):
        check_steps(got, want)
    assert any(start > 0 for _, start, _ in logs[0])  # replica 0's 40-token prompt ran in chunks
    assert sum(pads) >= 4  # replica 1 decodes 5 tokens more: replica 0 pads meanwhile
    assert runner.padding_steps - before == sum(pads) + 2  # and both replicas in the releasing step
    assert runner.padding_tokens == runner.padding_steps * PADDING_ROWS


@pytest.mark.parametrize("busy", [0, 1])
def test_an_idle_replica_pads_every_step_while_the_other_runs_alone(tiny_dir, dp, single_rank, busy):
    runner, par, _ = dp
    schedulers = [scheduler_for(engine_config(tiny_dir, par)) for _ in range(2)]
    add_requests(schedulers[busy], PROMPTS[busy], DECODE[busy])
    steps, pads = 0, runner.padding_steps

    def counted(batches):
        nonlocal steps
        steps += 1
        assert batches[1 - busy] is None
        return runner.execute_all(batches)

    logs = lockstep(counted, schedulers)
    release_all(runner.execute_all, schedulers)
    check_steps(logs[busy], single_rank[busy])
    assert logs[1 - busy] == []
    assert steps >= 6
    assert runner.padding_steps - pads == steps + 2  # and both replicas in the releasing step


def test_execute_all_refuses_a_wrong_number_of_batches_or_no_batch_at_all(dp):
    runner, _, _ = dp
    with pytest.raises(ValueError, match="one batch \\(or None\\) per replica: got 1 for 2 replicas"):
        runner.execute_all([None])
    with pytest.raises(ValueError, match="at least one replica's batch"):
        runner.execute_all([None, None])


@pytest.mark.parametrize("expert_parallel", [True, False], ids=["expert-parallel", "tp-experts"])
def test_two_replicas_of_two_tensor_parallel_ranks_give_each_batch_its_single_rank_logits(
        tiny_dir, single_rank, expert_parallel):
    par = ParallelConfig(2, data_parallel_size=2, enable_expert_parallel=expert_parallel)
    out = io.StringIO()
    runner = start_data_parallel_runner(rank_spec(tiny_dir, par), keep_logits=True, out=out)
    try:
        assert "replica 1: ranks 2..3" in out.getvalue()
        schedulers = [scheduler_for(engine_config(tiny_dir, par)) for _ in range(2)]
        for s, prompts, decode in zip(schedulers, PROMPTS, DECODE):
            add_requests(s, prompts, decode)
        logs = lockstep(runner.execute_all, schedulers)
    finally:
        runner.close()
    for got, want in zip(logs, single_rank):
        check_steps(got, want)
    assert runner.padding_steps >= 4  # replica 0 (ranks 0 and 1) padded while replica 1 decoded on


@pytest.mark.parametrize("formats", ["fp8", "fp8+fp4"])
def test_replicas_on_a_quantized_checkpoint_give_each_batch_its_single_rank_logits(tmp_path, formats):
    """FP8 experts split over both ranks; FP8 + MXFP4 experts partitioned whole (their 32-wide inputs cannot
    be split at 2 ranks); ``quant_sim`` off on both sides."""
    model_dir = make_tiny_checkpoint(tmp_path / formats, fp8=True, fp4_experts=formats == "fp8+fp4")
    want = []
    for prompts, decode in zip(PROMPTS, DECODE):
        config = engine_config(model_dir, ParallelConfig())
        runner = build_engine(config, keep_logits=True, poison=True, quant_sim=False).runner
        scheduler = scheduler_for(config)
        add_requests(scheduler, prompts, decode)
        want.append(lockstep(lambda batches: [runner.execute(batches[0])], [scheduler])[0])
    par = ParallelConfig(1, data_parallel_size=2, enable_expert_parallel=formats == "fp8+fp4")
    spec = dataclasses.replace(rank_spec(model_dir, par), quant_sim=False)
    runner = start_data_parallel_runner(spec, keep_logits=True, out=io.StringIO())
    try:
        schedulers = [scheduler_for(engine_config(model_dir, par)) for _ in range(2)]
        for s, prompts, decode in zip(schedulers, PROMPTS, DECODE):
            add_requests(s, prompts, decode)
        logs = lockstep(runner.execute_all, schedulers)
    finally:
        runner.close()
    for got, w in zip(logs, want):
        check_steps(got, w)
