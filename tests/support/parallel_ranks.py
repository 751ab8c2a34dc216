"""Code that runs inside a spawned rank of the multi-process tests (importable by the child)."""

from __future__ import annotations

import torch

from atom.models.deepseek_v4.checkpoint import random_state_dict
from atom.models.deepseek_v4.config import DeepseekV4Config
from atom.models.deepseek_v4.model import DeepseekV4Model
from atom.parallel.process_group import join
from atom.parallel.shard_plan import ShardPlan
from atom.parallel.sharding import shard_model

CFG = DeepseekV4Config.tiny()
TOKENS = torch.arange(3, 3 + 4 * 37, 4) % CFG.vocab_size


def sharded_layers(model: DeepseekV4Model, tokens: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Embedding, a hash-routed MoE (layer 0), a score-routed MoE (layer 3), the LM head."""
    x = model.embed(tokens)
    z = model.layers[3].ffn(model.layers[0].ffn(x, tokens), tokens)
    return x, z, model.logits(z)


def layers_rank(rank: int, init: str, device_type: str, expert_parallel: bool, queue) -> None:
    """Rank ``rank`` of 2: shard the seeded tiny model, run :func:`sharded_layers`, rank 0 reports."""
    device = f"cuda:{rank}" if device_type == "cuda" else "cpu"
    if device_type == "cuda":
        torch.cuda.set_device(rank)
    group = join(rank, 2, init, device)
    plan = ShardPlan(rank, 2, True, expert_parallel, CFG.n_routed_experts)
    model = shard_model(DeepseekV4Model(CFG, device="meta"), plan, group.comm, device)
    full = random_state_dict(CFG, seed=1)
    with torch.no_grad():
        for name, t in model.state_dict().items():
            spec, src = plan.spec(name), full[name]
            if spec is not None:
                start, stop = spec.bounds(src.shape[spec.dim])
                src = src.narrow(spec.dim, start, stop - start)
            t.copy_(src.to(t.dtype))
        out = sharded_layers(model, TOKENS.to(device))
    if rank == 0:
        queue.put(tuple(t.cpu() for t in out))
    group.leave()
