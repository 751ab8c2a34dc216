"""Code that runs inside a spawned rank of the fixed-capacity exchange tests (importable by the child):
``size`` ranks in ``replicas`` attention replicas, the routed experts split or partitioned over all of them;
each rank runs its replica's tokens through a hash-routed and a score-routed MoE layer under the counted
exchange and under fixed capacities, and reports every output."""

from __future__ import annotations

import torch

from atom.models.deepseek_v4_serving import DeepseekV4ForServing
from atom.parallel.expert_exchange import decode_capacity, set_exchange_capacity
from atom.parallel.process_group import join, replica_comm
from atom.parallel.shard_plan import ShardPlan
from atom.parallel.sharding import shard_model
from support.exchange_ranks import CFG, HASH_LAYER, SCORE_LAYER, load_full, moe_outputs

#: rows of replica ``d``'s tokens in the "all" case (replica 0 the most: it sets the tight capacity)
ROWS = (23, 14, 9, 5)
#: "all": every replica runs its tokens; "empty": the last replica has none; "padding": it runs a padding step
CASES = ("all", "empty", "padding")


def replica_tokens(replica: int, replicas: int, case: str) -> torch.Tensor:
    """Token ids replica ``replica`` of ``replicas`` runs in ``case`` (the last replica none in "empty")."""
    if case != "all" and replica == replicas - 1:
        return torch.zeros(0, dtype=torch.int64)
    step = 4 + 5 * replica
    return torch.arange(3 + replica, 3 + replica + step * ROWS[replica], step) % CFG.vocab_size


def capacities(replica_size: int) -> tuple[int, int, int]:
    """The counted exchange (0), the tightest fixed capacity for :data:`ROWS`, and a looser one."""
    tight = decode_capacity(max(ROWS), replica_size)
    return 0, tight, tight + 9


def fixed_exchange_rank(rank: int, init: str, size: int, replicas: int, expert_parallel: bool, queue) -> None:
    """Rank ``rank`` of ``size`` (gloo): its shard, then for every capacity of :func:`capacities` and every
    case of :data:`CASES` its replica's outputs of both MoE layers, reported as ``(rank, capacity, case,
    outputs)`` (outputs None for a padding step)."""
    torch.set_num_threads(1)
    group = join(rank, size, init, "cpu")
    t = size // replicas
    replica = rank // t
    plan = ShardPlan(rank, size, split_attention=False, expert_parallel=expert_parallel,
                     n_experts=CFG.n_routed_experts, replicas=replicas)
    model = shard_model(DeepseekV4ForServing(CFG, device="meta"), plan, replica_comm(group, t), group.device,
                        expert_comm=group.comm)
    load_full(model, plan)
    for capacity in capacities(t):
        assert set_exchange_capacity(model, capacity) == len(model.layers) + len(model.mtp)
        for case in CASES:
            if case == "padding" and replica == replicas - 1:
                with torch.no_grad():
                    for i in (HASH_LAYER, SCORE_LAYER):
                        model.layers[i].ffn.pad_experts(1, torch.float32)
                queue.put((rank, capacity, case, None))
            else:
                outs = moe_outputs(model, replica_tokens(replica, replicas, case))
                queue.put((rank, capacity, case, [o.numpy() for o in outs]))
    group.leave()


def fixed_exchange_reports(size: int, replicas: int, expert_parallel: bool) -> dict:
    """``{(rank, capacity, case): outputs}`` of :func:`fixed_exchange_rank` over ``size`` spawned ranks."""
    from support.parallel_ranks import run_ranks

    results = size * 3 * len(CASES)
    reports = run_ranks(fixed_exchange_rank, (size, replicas, expert_parallel), results=results, size=size)
    return {(rank, capacity, case): out for rank, capacity, case, out in reports}
