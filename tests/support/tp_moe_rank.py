"""A tensor-parallel rank's serving MoE layer on the Triton backend (interpreter), run inside a spawned rank of
``tests/parallel/test_tp_fused_moe.py``."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported in this process

import torch  # noqa: E402

from atom.kernels.backend import load_kernels  # noqa: E402
from atom.models.deepseek_v4.config import DeepseekV4Config  # noqa: E402
from atom.models.deepseek_v4_serving.model import DeepseekV4ForServing  # noqa: E402
from atom.parallel.process_group import join  # noqa: E402
from atom.parallel.shard_plan import ShardPlan  # noqa: E402
from atom.parallel.sharding import SplitInputLinear  # noqa: E402

LAYER = 3  # score-routed (the first two route by token id)


def moe_inputs(cfg: DeepseekV4Config, tokens: int = 37, seed: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    """``(x [tokens, dim], token ids [tokens])`` for the layer comparison."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(tokens, cfg.dim, generator=gen), torch.arange(3, 3 + 4 * tokens, 4) % cfg.vocab_size


def tp_moe_rank(rank: int, init: str, model_dir: str, queue) -> None:
    """Rank ``rank`` of 2 (gloo): its tensor-parallel shard of the serving model in ``model_dir`` with
    ``quant_sim``, layer :data:`LAYER`'s MoE bound to the Triton kernels; reports ``(rank, flags, [output, the
    activations in front of w2 before and after their rounding])``, recording the rounding by wrapping the held
    ``w2``'s ``quantize_input`` (what the fused op calls as its ``h_quant``)."""
    from atom.models.deepseek_v4.loader import read_config
    from atom.parallel.shard_loader import load_sharded_checkpoint

    torch.set_num_threads(1)
    group = join(rank, 2, init, "cpu")
    plan = ShardPlan(rank, 2, True, False, read_config(model_dir).n_routed_experts)
    model = load_sharded_checkpoint(model_dir, plan, group.comm, quant_sim=True, model_class=DeepseekV4ForServing)
    moe = model.layers[LAYER].ffn
    moe.bind_kernels(load_kernels("triton"))
    w2 = moe.experts[0].w2
    split = type(w2) is SplitInputLinear
    rounding = w2.quantize_input
    seen: list[torch.Tensor] = []

    def recorded(h: torch.Tensor) -> torch.Tensor:
        out = rounding(h)
        seen.extend((h.clone(), out.clone()))
        return out

    w2.quantize_input = recorded
    x, tokens = moe_inputs(model.cfg)
    with torch.no_grad():
        out = moe(x, tokens)
    flags = {"split_w2": split, "fusable": moe.fusable, "host_free": moe.host_free, "calls": len(seen) // 2}
    queue.put((rank, flags, [t.numpy() for t in (out, *seen[:2])]))  # plain arrays outlive this process
    group.leave()
