"""The engine over 2 gloo ranks computes what it computes on one: same greedy tokens and every
step's logits within 1e-5 relative, through chunked prefill, decode, a prefix hit that restores
the CSA boundary state from the (NaN-poisoned) arena, and a preemption forced by a 2-chunk arena.

Rank 0 is this process; ``build_engine`` spawns rank 1 (the path ``atom serve`` takes)."""

from __future__ import annotations

import pytest
import torch

from atom.config import ParallelConfig
from atom.parallel.executor import DistributedRunner
from support.parallel_engine import make_engine, scenario

pytestmark = pytest.mark.slow

MODES = {
    "tp2": ParallelConfig(2),
    "ep2-replicated-attention": ParallelConfig(2, enable_expert_parallel=True, replicate_attention=True),
    "tp2+ep2": ParallelConfig(2, enable_expert_parallel=True),
}


@pytest.fixture(scope="module")
def single_rank(tiny_dir):
    torch.set_num_threads(1)
    return scenario(make_engine(tiny_dir, ParallelConfig()))


def test_the_single_rank_scenario_exercises_a_csa_restore_and_a_preemption(single_rank):
    _, steps, hit_tokens, preemptions = single_rank
    assert hit_tokens == 32 and any(restore >= 0 for _, _, restore, _ in steps)
    assert preemptions >= 1
    assert any(logits.shape[0] > 1 for _, start, _, logits in steps if start > 0)  # a chunked prefill ran


@pytest.mark.parametrize("mode", list(MODES))
def test_two_ranks_give_the_single_rank_tokens_and_logits(tiny_dir, single_rank, mode):
    engine = make_engine(tiny_dir, MODES[mode])
    assert isinstance(engine.runner, DistributedRunner)
    try:
        outputs, steps, hit_tokens, preemptions = scenario(engine)
    finally:
        engine.runner.close()
    want_outputs, want_steps, want_hit, want_preemptions = single_rank
    assert outputs == want_outputs
    assert (hit_tokens, preemptions) == (want_hit, want_preemptions)
    assert [s[:3] for s in steps] == [s[:3] for s in want_steps]
    for (*_, got), (*_, want) in zip(steps, want_steps):
        assert not torch.isnan(got).any()
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))
