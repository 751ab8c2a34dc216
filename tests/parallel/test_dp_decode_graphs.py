"""Data-parallel replicas capture and replay their decode graphs together (CPU emulation of capture, gloo
collectives recorded in the graphs): two replicas of one rank, experts partitioned over both, running
different batches (2 and 3 requests; replica 0 done first, then padding) at the group's key: the replays
equal the same steps run eagerly on the same padded shapes bit for bit, and every replica's tokens equal
eager decode's, its logits within ``UNPADDED_BOUND`` of the step's largest."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from atom.testing.graph_checks import UNPADDED_BOUND
from support.dp_graph_ranks import dp_graph_runs

pytestmark = pytest.mark.slow  # two spawned ranks, each running the scenario three times


def test_replicas_replaying_graphs_at_the_group_key_equal_eager_replicas(tiny_dir, tmp_path):
    seen = dp_graph_runs(tiny_dir, tmp_path)
    first = seen[0]
    assert first["graph"]["tokens"] == first["padded"]["tokens"] == first["eager"]["tokens"]
    assert [len(t) for t in first["graph"]["tokens"][0] + first["graph"]["tokens"][1]] == [4, 4, 9, 9, 9]
    assert first["graph"]["bucketed"] == first["padded"]["bucketed"] > 0 and first["eager"]["bucketed"] == 0
    assert first["graph"]["padding"] > 0  # replica 0 padded while replica 1 decoded on
    for rank in seen:
        assert rank["graph"]["graphs"] >= 1 and rank["graph"]["graphs"] == seen[0]["graph"]["graphs"]
        assert rank["padded"]["graphs"] == rank["eager"]["graphs"] == 0
        graph, padded = rank["graph"]["logits"], rank["padded"]["logits"]
        assert len(graph) == len(padded) and all(torch.equal(a, b) for a, b in zip(graph, padded))
        for a, b in zip(graph, rank["eager"]["logits"]):  # unpadded eager: another row count (measured 1.17e-6)
            assert a.shape == b.shape
            worst, scale = np.abs((a - b).numpy()).max(initial=0.0), np.abs(b.numpy()).max(initial=0.0)
            assert worst <= UNPADDED_BOUND * scale
