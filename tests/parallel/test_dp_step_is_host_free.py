"""A data-parallel decode step reads nothing back: two gloo replicas of the tiny model (routed experts
partitioned over both), each decoding its own batch (3 and 2 requests), run every MoE layer's exchange at
fixed capacity, and their forwards dispatch no sync op (``.item()``, ``.tolist()``, ``nonzero``, boolean
indexing) and the same ops every step, the two replicas' differing only by the expert offset of the second
partition; the prefill step before them ran the counted exchange, whose
one read per MoE layer the counter sees."""

from __future__ import annotations

import pytest

from support.dp_host_free_ranks import PROMPTS, STEPS, host_free_rank
from support.exchange_ranks import CFG
from support.parallel_ranks import run_ranks


@pytest.mark.slow
def test_a_data_parallel_decode_step_has_no_sync_and_the_prefill_step_one_read_per_moe_layer():
    reports = {rank: (capacity, steps) for rank, capacity, steps in run_ranks(host_free_rank, (), results=2)}
    decode_ops: dict[int, list[dict]] = {0: [], 1: []}
    for rank, (capacity, steps) in reports.items():
        assert capacity == 4  # max_num_seqs 4, one token each, replicas of one rank
        assert len(steps) == len(reports[0][1]) >= STEPS  # the same steps on both (the engine may run ahead)
        (cap, rows, syncs, _), *decodes = steps
        assert cap == 0 and rows == sum(PROMPTS[rank])  # the prefill: the counted exchange
        assert syncs == {"_local_scalar_dense": 0, "nonzero": 0, "tolist": CFG.n_layers, "index_bool": 0}
        for cap, rows, syncs, ops in decodes:
            assert cap == 4 and rows == len(PROMPTS[rank])
            assert syncs == {"_local_scalar_dense": 0, "nonzero": 0, "tolist": 0, "index_bool": 0}
            decode_ops[rank].append(ops)
    for rank in (0, 1):
        assert all(ops == decode_ops[rank][0] for ops in decode_ops[rank])
    # 3 rows or 2: the same ops on both replicas but for rank 1's expert offset (its partition starts at expert
    # 4: the fused op shifts the ids and moves other ranks' experts last, one sub, lt and masked_fill per layer)
    first, second = decode_ops[0][0], decode_ops[1][0]
    offset = {"sub": CFG.n_layers, "lt": CFG.n_layers, "masked_fill": CFG.n_layers}
    assert {k: second[k] - first.get(k, 0) for k in second if second[k] != first.get(k, 0)} == offset
    assert set(first) <= set(second)
