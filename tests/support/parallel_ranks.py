"""Code that runs inside a spawned rank of the multi-process tests (importable by the child)."""

from __future__ import annotations

import torch

from atom.models.deepseek_v4.checkpoint import random_state_dict
from atom.models.deepseek_v4.config import DeepseekV4Config
from atom.models.deepseek_v4.model import DeepseekV4Model
from atom.parallel.process_group import free_port, join
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
        queue.put([t.cpu().numpy() for t in out])  # plain arrays: a tensor's shared memory dies with this process
    group.leave()


def quantized_inputs(dim_in: int, seed: int = 5) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(x [T, dim], o [T, dim_in], token ids [T])`` for the quantized-layer comparison."""
    gen = torch.Generator().manual_seed(seed)
    o = torch.randn(len(TOKENS), dim_in, generator=gen)
    o[::2, 0] *= 1e4  # a block maximum in rank 0's columns sets the scale of rank 1's (then subnormal) values
    return torch.randn(len(TOKENS), CFG.dim, generator=gen), o, TOKENS


def quantized_layers(model: DeepseekV4Model, x: torch.Tensor, o: torch.Tensor, tokens: torch.Tensor
                     ) -> tuple[torch.Tensor, ...]:
    """Row-parallel quantized layers under ``quant_sim``: ``wo_b`` (its input ``o`` is this rank's columns),
    its FP8 input round-trip, the shared expert and a score-routed MoE with FP8 experts (w2 row-parallel)."""
    wo_b = model.layers[3].attn.wo_b
    comm = model.layers[3].ffn.comm
    return (wo_b.quantize_input(o), comm.all_reduce(wo_b(o)), comm.all_reduce(model.layers[3].ffn.shared_experts(x)),
            model.layers[3].ffn(x, tokens))


def quantized_layers_rank(rank: int, init: str, model_dir: str, queue) -> None:
    """Rank ``rank`` of 2 (gloo): load its shard of the FP8 checkpoint with ``quant_sim``, run
    :func:`quantized_layers` on its columns of ``o``; every rank reports ``(rank, outputs)``."""
    from atom.parallel.shard_loader import load_sharded_checkpoint

    group = join(rank, 2, init, "cpu")
    plan = ShardPlan(rank, 2, True, False, CFG.n_routed_experts)
    model = load_sharded_checkpoint(model_dir, plan, group.comm, quant_sim=True)
    x, o, tokens = quantized_inputs(CFG.o_groups * CFG.o_lora_rank)
    start, stop = plan.spec("layers.3.attn.wo_b.weight").bounds(o.shape[1])
    with torch.no_grad():
        out = quantized_layers(model, x, o[:, start:stop].contiguous(), tokens)
    queue.put((rank, [t.numpy() for t in out]))  # plain arrays: a tensor's shared memory dies with this process
    group.leave()


def run_ranks(target, args: tuple, *, results: int, size: int = 2, timeout: float = 300) -> list:
    """Run ``target(rank, init, *args, queue)`` in ``size`` spawned processes; the first ``results`` items
    they put on the queue, after every process exited with status 0."""
    ctx = torch.multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    init = f"tcp://127.0.0.1:{free_port()}"
    procs = [ctx.Process(target=target, args=(r, init, *args, queue)) for r in range(size)]
    for p in procs:
        p.start()
    try:
        got = [queue.get(timeout=timeout) for _ in range(results)]
    finally:
        for p in procs:
            p.join(60)
            if p.is_alive():
                p.kill()
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    return got
