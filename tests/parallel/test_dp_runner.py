"""Data-parallel attention over 2 gloo ranks (2 replicas of 1 rank; experts partitioned or split over
both): each replica runs its own requests, and every step's logits equal one rank running those
requests alone, within 1e-5 relative (chunked prefill through the counted expert exchange, decode through
the fixed-capacity one); a replica left idle runs padding
steps (counted) while the other runs, in both directions, without a hang.
(``test_dp_runner_layouts.py``: 4 ranks, quantized checkpoints.)

Rank 0 is this process; ``start_data_parallel_runner`` spawns rank 1."""

from __future__ import annotations

import io

import pytest
import torch

from atom.config import ParallelConfig
from atom.parallel.dp_runner import PADDING_ROWS, start_data_parallel_runner
from support.dp_lockstep import (DECODE, PROMPTS, add_requests, check_steps, engine_config, lockstep, rank_spec,
                                 release_all, scheduler_for, single_rank_steps)

pytestmark = pytest.mark.slow

MODES = {"expert-parallel": True, "tp-experts": False}


@pytest.fixture(scope="module")
def single_rank(tiny_dir):
    """Per replica's prompts, the steps one rank runs for them alone."""
    torch.set_num_threads(1)
    return single_rank_steps(tiny_dir, DECODE)


@pytest.fixture(scope="module", params=list(MODES))
def dp(request, tiny_dir):
    par = ParallelConfig(1, data_parallel_size=2, enable_expert_parallel=MODES[request.param])
    out = io.StringIO()
    runner = start_data_parallel_runner(rank_spec(tiny_dir, par), keep_logits=True, out=out)
    yield runner, par, out.getvalue()
    runner.close()


def test_two_replicas_running_different_batches_give_each_batch_its_single_rank_logits(tiny_dir, dp, single_rank):
    runner, par, report = dp
    assert runner.replicas == 2
    assert "replica 0: ranks 0..0" in report and "replica 1: ranks 1..1" in report
    schedulers = [scheduler_for(engine_config(tiny_dir, par)) for _ in range(2)]
    for s, prompts, decode in zip(schedulers, PROMPTS, DECODE):
        add_requests(s, prompts, decode)
    before, pads, fixed, decodes = runner.padding_steps, [], runner.fixed_steps, 0

    def counted(batches):
        nonlocal decodes
        pads.append(sum(b is None or not b.seqs for b in batches))
        decodes += all(b is None or all(len(s.token_ids) == 1 and s.sample for s in b.seqs) for b in batches)
        return runner.execute_all(batches)

    logs = lockstep(counted, schedulers)
    release_all(runner.execute_all, schedulers)
    for got, want in zip(logs, single_rank):
        check_steps(got, want)
    assert any(start > 0 for _, start, _ in logs[0])  # replica 0's 40-token prompt ran in chunks
    assert sum(pads) >= 4  # replica 1 decodes 5 tokens more: replica 0 pads meanwhile
    assert runner.padding_steps - before == sum(pads) + 2  # and both replicas in the releasing step
    assert runner.padding_tokens == runner.padding_steps * PADDING_ROWS
    # every step of decodes and padding ran the fixed-capacity exchange (no host read), prefill the counted one
    assert decodes >= 5 and runner.fixed_steps - fixed == decodes + 1  # + the releasing step: both replicas pad


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

