"""Code that runs inside a spawned rank of the expert-exchange tests (importable by the child): two
attention replicas of one rank each, the routed experts split over both."""

from __future__ import annotations

import torch

from atom.comm import Comm
from atom.models.deepseek_v4.checkpoint import random_state_dict
from atom.models.deepseek_v4.config import DeepseekV4Config
from atom.models.deepseek_v4_serving import DeepseekV4ForServing
from atom.parallel.process_group import join
from atom.parallel.shard_plan import ShardPlan
from atom.parallel.sharding import shard_model

CFG = DeepseekV4Config.tiny()
HASH_LAYER, SCORE_LAYER = 0, 3  # tiny: layers 0 and 1 are hash-routed
assert HASH_LAYER < CFG.n_hash_layers <= SCORE_LAYER


def replica_tokens(rank: int, case: str) -> torch.Tensor:
    """The token ids replica ``rank`` runs: 23 on rank 0 and 14 others on rank 1 (``case`` "both"), none on
    rank 1 ("empty"), or rank 1 runs a padding step instead ("padding")."""
    if rank == 0:
        return torch.arange(3, 3 + 4 * 23, 4) % CFG.vocab_size
    return torch.arange(7, 7 + 9 * 14, 9) % CFG.vocab_size if case == "both" else torch.zeros(0, dtype=torch.int64)


def moe_inputs(tokens: torch.Tensor) -> torch.Tensor:
    """``[T, dim]`` inputs of the MoE for ``tokens`` (a fixed function of each token id, so any rank can
    recompute another's)."""
    gen = torch.Generator().manual_seed(11)
    table = torch.randn(CFG.vocab_size, CFG.dim, generator=gen)
    return table[tokens]


def moe_outputs(model: DeepseekV4ForServing, tokens: torch.Tensor) -> list[torch.Tensor]:
    """The hash-routed and the score-routed MoE layers over ``tokens``."""
    x = moe_inputs(tokens.cpu()).to(tokens.device)
    with torch.no_grad():
        return [model.layers[i].ffn(x, tokens) for i in (HASH_LAYER, SCORE_LAYER)]


def load_full(model: torch.nn.Module, plan: ShardPlan | None) -> None:
    """Copy the seeded tiny weights (this rank's slices under ``plan``) into ``model``."""
    full = random_state_dict(CFG, seed=1)
    with torch.no_grad():
        for name, t in model.state_dict().items():
            spec, src = (None if plan is None else plan.spec(name)), full[name]
            if spec is not None:
                start, stop = spec.bounds(src.shape[spec.dim])
                src = src.narrow(spec.dim, start, stop - start)
            t.copy_(src.to(t.dtype))


CASES = ("both", "empty", "padding")


def exchange_rank(rank: int, init: str, expert_parallel: bool, device_type: str, queue) -> None:
    """Replica ``rank`` of 2 (gloo on ``device_type`` "cpu", NCCL on "cuda": rank ``k`` on GPU ``k``): its
    shard; for each of :data:`CASES` its own tokens through both MoE layers; reports ``(rank, case,
    outputs)`` (outputs None when rank 1 ran a padding step of one row per layer)."""
    group = join(rank, 2, init, device_type)
    plan = ShardPlan(rank, 2, split_attention=False, expert_parallel=expert_parallel,
                     n_experts=CFG.n_routed_experts, replicas=2)
    model = shard_model(DeepseekV4ForServing(CFG, device="meta"), plan, Comm(), group.device,
                        expert_comm=group.comm)
    load_full(model, plan)
    for case in CASES:
        if rank == 1 and case == "padding":
            with torch.no_grad():
                for i in (HASH_LAYER, SCORE_LAYER):
                    model.layers[i].ffn.pad_experts(1, torch.float32)
            queue.put((rank, case, None))
        else:
            tokens = replica_tokens(rank, case).to(group.device)
            queue.put((rank, case, [t.cpu().numpy() for t in moe_outputs(model, tokens)]))
    group.leave()


def exchange_reports(expert_parallel: bool, device_type: str) -> dict:
    """``{(rank, case): outputs}`` of :func:`exchange_rank` over 2 spawned ranks."""
    from support.parallel_ranks import run_ranks

    reports = run_ranks(exchange_rank, (expert_parallel, device_type), results=2 * len(CASES))
    return {(rank, case): out for rank, case, out in reports}
