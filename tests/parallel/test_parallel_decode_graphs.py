"""Tensor- and expert-parallel ranks each capture and replay their own decode graphs (CPU emulation of capture,
gloo collectives recorded in the graphs): rank 0 broadcasts every batch, each rank copies it into its own
bucketed inputs, and the replay equals eager decode on the same shapes bit for bit and samples what unpadded
eager decode samples, on both ranks alike (atom.testing.graph_ranks)."""

from __future__ import annotations

import pytest
import torch

from atom.config import ParallelConfig
from atom.testing.graph_checks import UNPADDED_BOUND, compare_runs
from atom.testing.graph_ranks import rank_runs, run_ranks

pytestmark = pytest.mark.slow  # two spawned ranks, each running the short scenario three times


@pytest.mark.parametrize("parallel", [ParallelConfig(2), ParallelConfig(2, enable_expert_parallel=True)],
                         ids=["tp2", "tp2+ep2"])
def test_ranks_replaying_their_own_graphs_equal_eager_ranks(tiny_dir, tmp_path, parallel):
    seen = run_ranks(tiny_dir, parallel, tmp_path)
    runs = rank_runs(seen[0])
    result = compare_runs(runs["graph"], runs["padded"], runs["eager"])
    assert {4, 2, 1} <= set(runs["graph"].buckets)
    assert [len(t) for t in runs["graph"].tokens] == [12, 8, 5, 3]
    assert result.same_shapes and result.tokens_equal
    assert result.unpadded <= UNPADDED_BOUND
    for rank in seen:  # every rank captured its own graphs and replayed every bucketed step
        assert rank["graph"]["graphs"] >= 3 and rank["graph"]["buckets"] == runs["graph"].buckets
        assert rank["padded"]["graphs"] == rank["eager"]["graphs"] == 0
    for a, b in zip(seen[0]["graph"]["logits"], seen[1]["graph"]["logits"]):  # the gathered logits agree
        assert torch.equal(a, b)
