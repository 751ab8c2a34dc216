"""MoE dispatch/combine across two attention replicas (gloo, 2 processes): each replica's own tokens
through a hash-routed and a score-routed MoE layer, the experts split over both ranks (expert parallel:
4 whole experts each; tensor parallel: half of every expert each), equal the single-rank layer within
1e-5 relative; a replica with no tokens, or running a padding step, still takes part."""

from __future__ import annotations

import pytest
import torch

from atom.models.deepseek_v4_serving import DeepseekV4ForServing
from atom.parallel.expert_exchange import ExpertExchange
from atom.comm import Comm
from support.exchange_ranks import CASES, CFG, exchange_reports, load_full, moe_outputs, replica_tokens

MODES = {"expert-parallel": True, "tp-experts": False}


@pytest.fixture(scope="module")
def single_rank():
    torch.set_num_threads(1)
    model = DeepseekV4ForServing(CFG)
    load_full(model, None)
    return model


def check_close(got: list, want: list[torch.Tensor]) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        g = torch.from_numpy(g)
        assert g.shape == w.shape
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5 * float(w.abs().max()))


@pytest.mark.slow
@pytest.mark.parametrize("mode", list(MODES))
def test_each_replica_gets_the_single_rank_moe_output_of_its_own_tokens(single_rank, mode):
    got = exchange_reports(MODES[mode], "cpu")
    for case in CASES:
        check_close(got[0, case], moe_outputs(single_rank, replica_tokens(0, case)))
    check_close(got[1, "both"], moe_outputs(single_rank, replica_tokens(1, "both")))
    assert [a.shape for a in got[1, "empty"]] == [(0, CFG.dim)] * 2  # no tokens: took part, got nothing
    assert got[1, "padding"] is None


def test_expert_parallel_rows_go_only_to_the_ranks_owning_their_experts():
    ex = ExpertExchange(Comm(0, 4, group="not used"), 8, expert_parallel=True)
    idx = torch.tensor([[0, 1], [1, 6], [7, 2], [3, 5]])
    want = torch.tensor([[1, 0, 0, 0], [1, 0, 0, 1], [0, 1, 0, 1], [0, 1, 1, 0]], dtype=torch.bool)
    assert torch.equal(ex.destinations(idx), want)
    assert torch.equal(ExpertExchange(Comm(0, 4, group="not used"), 8, expert_parallel=False).destinations(idx),
                       torch.ones(4, 4, dtype=torch.bool))


def test_experts_that_do_not_divide_over_the_ranks_are_refused():
    with pytest.raises(ValueError, match="8 routed experts cannot be partitioned over 3 ranks"):
        ExpertExchange(Comm(0, 3, group="not used"), 8, expert_parallel=True)


@pytest.mark.parametrize("expert_parallel", [True, False])
def test_each_peers_rows_come_from_a_fixed_size_sort_in_the_order_of_the_routing_grid(expert_parallel):
    ex = ExpertExchange(Comm(0, 4, group="not used"), 8, expert_parallel=expert_parallel)
    idx = torch.tensor([[0, 1], [1, 6], [7, 2], [3, 5], [4, 5]])
    order, counts = ex._plan(idx)
    assert order.shape == (4 * 5,)  # set by the shapes, not by the routing
    if expert_parallel:  # peer 0: rows 0, 1; peer 1: rows 2, 3; peer 2: rows 3, 4; peer 3: rows 1, 2
        assert counts.tolist() == [2, 2, 2, 2] and order[:8].tolist() == [0, 1, 2, 3, 3, 4, 1, 2]
    else:
        assert counts.tolist() == [5] * 4 and order.tolist() == list(range(5)) * 4
    empty, none = ex._plan(idx[:0])
    assert empty.shape == (0,) and none.tolist() == [0] * 4
