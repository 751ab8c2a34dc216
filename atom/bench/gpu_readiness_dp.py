"""The data-parallel case of the fake-device check (:mod:`atom.bench.gpu_readiness`), opt-in like the
tensor-parallel one: ``python -m atom.bench.gpu_readiness --cases "flash dp2 decode b8"``.

Two spawned processes joined by a gloo group are two attention replicas of one rank each (data-parallel
attention): each holds the whole thin V4-Flash model in the release format except the routed experts,
partitioned over both (expert parallel, :func:`atom.parallel.sharding.shard_model` with ``replicas=2``),
so every MoE layer sends its routed rows to the rank holding their experts
(:mod:`atom.parallel.expert_exchange`). Each rank runs its own engine on its own requests (the same prompts
on both, so both schedule the same steps and meet in every exchange; fake reads give both the same tokens)
and picks each step's exchange as the data-parallel runner does (:func:`atom.parallel.dp_runner.step_capacity`:
the prefill chunk through the counted exchange, decode steps through the fixed-capacity one). The counted
step is a decode step at batch 8: the fixed-capacity exchange reads nothing back, so its counts are those of
a single-rank step. Collectives on fake tensors are shape-only (no data moves, nothing is counted).
"""

from __future__ import annotations

import multiprocessing

import torch

from atom.bench.fake_device import DeviceAccessCounter, fake_cuda, to_fake_cuda
from atom.bench.gpu_readiness import Case, _engine, add_prompts, measure, release_meta_model
from atom.comm import Comm
from atom.parallel.dp_runner import exchange_capacity, step_capacity
from atom.parallel.expert_exchange import set_exchange_capacity
from atom.parallel.shard_plan import ShardPlan
from atom.parallel.sharding import shard_model

__all__ = ["dp_meta_model", "run_dp_case", "dp_rank"]


def dp_meta_model(kind: str, rank: int, replicas: int, expert_comm: Comm):
    """The thin ``kind`` release model on ``meta``, sharded as replica ``rank`` of ``replicas`` attention
    replicas of one rank: everything whole but the routed experts, partitioned over the replicas and reached
    through an exchange over ``expert_comm``."""
    model = release_meta_model(kind)
    plan = ShardPlan(rank, replicas, split_attention=False, expert_parallel=True,
                     n_experts=model.cfg.n_routed_experts, replicas=replicas)
    return shard_model(model, plan, Comm(), "meta", expert_comm=expert_comm)


def run_dp_case(case: Case, model) -> tuple[DeviceAccessCounter, str]:
    """Run ``case`` on this replica's ``model`` (on the fake device), every replica scheduling the same steps,
    each step's exchange chosen as the data-parallel runner chooses it; the measured step's count and
    description (:func:`~atom.bench.gpu_readiness.measure`)."""
    engine = _engine(model, case, 4096)
    add_prompts(engine, case)
    runner = engine.runner
    capacity = exchange_capacity(runner, 1)
    execute = runner.execute
    fixed: list[int] = []

    def replica_execute(batch):
        step = step_capacity([batch] * case.tp, capacity, 1)  # every replica runs this schedule
        set_exchange_capacity(runner.model, step)
        fixed.append(step)
        return execute(batch)

    runner.execute = replica_execute
    counter = DeviceAccessCounter()
    step = measure(engine, case, counter)
    if not fixed[-1] or fixed[0]:
        raise RuntimeError(f"{case.name}: expected a prefill step on the counted exchange and a measured decode "
                           f"step on the fixed-capacity one; capacities per step {fixed}")
    return counter, step


def dp_rank(rank: int, case: Case, init_method: str, results: "multiprocessing.Queue") -> None:
    """Replica ``rank`` of ``case``'s data-parallel group, in a spawned process: its shard on fake ``cuda``,
    the case's steps, the counted step's accesses put on ``results`` as ``(rank, accesses, step)``."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=case.tp)
    try:
        meta = dp_meta_model(case.model, rank, case.tp, Comm(rank, case.tp, dist.group.WORLD))
        with fake_cuda() as mode, torch.no_grad():
            counter, step = run_dp_case(case, to_fake_cuda(meta, mode).eval())
            results.put((rank, counter.accesses, step))
    finally:
        dist.destroy_process_group()
