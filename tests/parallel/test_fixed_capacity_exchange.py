"""The fixed-capacity expert exchange (no host read, shapes set by the capacity) gives every replica the
counted exchange's MoE outputs (bit for bit with expert-parallel experts; within the fp32 rounding of the grouped
GEMM's summation order with tensor-parallel ones): gloo with 2 and 4 ranks, replicas of one and of two ranks,
expert-parallel and tensor-parallel experts, hash- and score-routed layers, a replica with no rows and a
replica running a padding step; and its slot plan, checked on one process."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from atom.comm import Comm
from atom.parallel.expert_exchange import ExpertExchange, decode_capacity
from support.fixed_exchange_ranks import CASES, capacities, fixed_exchange_reports

LAYOUTS = {"2x1": (2, 2), "4x1": (4, 4), "2x2": (4, 2)}  # replicas x ranks per replica: (ranks, replicas)
MODES = {"expert-parallel": True, "tp-experts": False}
#: Tensor-parallel experts run the reference's grouped GEMM (a batched matmul over the received rows) on the CPU,
#: whose kernel, and so the fp32 summation order, may change with the row count: the fixed exchange's outputs are
#: within 4 fp32 ulps of the step's largest value of the counted one's (measured: 4.4e-8 of it, 4x1); expert-
#: parallel ranks run one GEMM per expert there and are bit-identical.
ROUNDING = 4 * torch.finfo(torch.float32).eps


@pytest.mark.slow
@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_every_fixed_capacity_gives_the_counted_exchange_outputs(layout, mode):
    size, replicas = LAYOUTS[layout]
    got = fixed_exchange_reports(size, replicas, MODES[mode])
    counted, *fixed = capacities(size // replicas)
    for rank in range(size):
        for case in CASES:
            want = got[rank, counted, case]
            if want is None:  # the last replica's padding step: nothing to compare, it took part
                assert case == "padding" and rank >= size - size // replicas
                assert all(got[rank, c, case] is None for c in fixed)
                continue
            assert len(want) == 2 and want[0].shape[1] == want[1].shape[1] == 64
            for capacity in fixed:
                for a, b in zip(got[rank, capacity, case], want):
                    assert a.dtype == b.dtype and a.shape == b.shape, (rank, capacity, case)
                    if MODES[mode]:
                        assert np.array_equal(a, b), (rank, capacity, case)
                    else:  # the grouped GEMM over another row count: its fp32 summation order may differ
                        bound = ROUNDING * float(np.abs(b).max(initial=0.0))
                        assert float(np.abs(a - b).max(initial=0.0)) <= bound, (rank, capacity, case)
    assert got[size - 1, counted, "empty"][0].shape == (0, 64)  # no rows: took part, got nothing


def exchange(world: int, capacity: int, expert_parallel: bool = True) -> ExpertExchange:
    ex = ExpertExchange(Comm(0, world, group="not used"), 8, expert_parallel=expert_parallel)
    ex.set_capacity(capacity)
    return ex


def test_each_peers_slots_hold_the_rows_it_needs_in_row_order_then_the_zero_row():
    idx = torch.tensor([[0, 1], [1, 6], [7, 2], [3, 5], [4, 5]])
    slots, valid = exchange(4, 6).fixed_slots(idx)
    # peer 0 (experts 0, 1): rows 0, 1; peer 1 (2, 3): rows 2, 3; peer 2 (4, 5): rows 3, 4; peer 3 (6, 7): 1, 2
    assert slots.tolist() == [[0, 1, 5, 5, 5, 5], [2, 3, 5, 5, 5, 5], [3, 4, 5, 5, 5, 5], [1, 2, 5, 5, 5, 5]]
    assert valid.sum(dim=1).tolist() == [2, 2, 2, 2] and valid[:, :2].all()
    slots, valid = exchange(2, 5, expert_parallel=False).fixed_slots(idx)
    assert slots.tolist() == [list(range(5))] * 2 and bool(valid.all())
    slots, valid = exchange(2, 3).fixed_slots(idx[:0])  # no rows: every slot the zero row
    assert slots.tolist() == [[0, 0, 0]] * 2 and not bool(valid.any())


def test_padding_slots_name_an_expert_the_receiving_peer_does_not_hold():
    assert exchange(4, 1)._idle_experts(torch.device("cpu")).tolist() == [2, 4, 6, 0]
    assert exchange(2, 1, expert_parallel=False)._idle_experts(torch.device("cpu")).tolist() == [0, 0]


def test_a_step_over_the_capacity_is_refused_before_any_collective():
    ex = exchange(2, 2)
    x, w, idx = torch.zeros(3, 4), torch.ones(3, 2), torch.zeros(3, 2, dtype=torch.int64)
    with pytest.raises(ValueError, match="holds 2 rows per peer; this rank dispatches 3 of a 3-row step"):
        ex.run_experts(x, w, idx, lambda *a: pytest.fail("no expert may run"))


@pytest.mark.parametrize("bad", [-1, 2.0, True, None])
def test_a_capacity_that_is_not_a_row_count_is_refused(bad):
    with pytest.raises(ValueError, match="accepted: 0 \\(counted exchange\\) or a positive number of rows"):
        exchange(2, 0).set_capacity(bad)


def test_the_decode_capacity_is_the_most_rows_one_rank_of_a_replica_dispatches():
    assert [decode_capacity(rows, 1) for rows in (1, 64)] == [1, 64]
    assert [decode_capacity(rows, 2) for rows in (1, 7, 64)] == [1, 4, 32]
    with pytest.raises(ValueError, match="must be >= 1"):
        decode_capacity(0, 2)


def test_the_second_rank_of_a_replica_with_no_rows_dispatches_none():
    ex = ExpertExchange(Comm(0, 2, group="not used"), 8, expert_parallel=True, replica=Comm(1, 2, group="not used"))
    assert ex._mine(0, torch.device("cpu")).tolist() == []
    assert ex._mine(5, torch.device("cpu")).tolist() == [1, 3]
