"""The serving MoE on a GPU backend (the Triton kernel set, under the interpreter): the shared expert's ``w1`` and
``w3`` run as one GEMM whose halves the SwiGLU kernel reads in place, and the routed sum lands on the shared
expert's output inside the fused op (no ``routed + shared`` launch); dense and FP8 shared experts, an FP8 merge
refused off the 128-row grid. The output equals the torch backend's (the reference's arithmetic)."""

import pytest
import torch

from atom.bench.kernel_count import KernelCounter
from atom.kernels.backend import load_kernels
from atom.models.deepseek_v4.checkpoint import random_state_dict
from atom.models.deepseek_v4.config import DeepseekV4Config
from atom.models.deepseek_v4_serving import DeepseekV4ForServing
from atom.models.deepseek_v4_serving.moe import ServingMoE

TOKENS = 5


def moe_layer(inter: int, shared_fp8: bool, act_quant: bool = False) -> ServingMoE:
    """The last (top-k routed) layer's MoE of a tiny serving model with ``moe_inter_dim = inter``; its shared
    expert in FP8 block-scaled storage when ``shared_fp8``."""
    cfg = DeepseekV4Config.tiny(moe_inter_dim=inter)
    model = DeepseekV4ForServing(cfg)
    model.load_state_dict(random_state_dict(cfg, seed=3))
    moe = model.layers[-1].ffn
    if shared_fp8:
        gen = torch.Generator().manual_seed(inter)
        for lin in (moe.shared_experts.w1, moe.shared_experts.w3, moe.shared_experts.w2):
            lin.set_format("fp8", act_quant=act_quant)
            lin.weight.data = (torch.randn(lin.weight.shape, generator=gen) * 4).to(torch.float8_e4m3fn)
            lin.scale.data = torch.randint(118, 122, lin.scale.shape, generator=gen,
                                           dtype=torch.uint8).view(torch.float8_e8m0fnu)
    return moe.eval()


def bind(moe: ServingMoE, backend: str) -> None:
    kernels = load_kernels(backend)
    for lin in moe.modules():
        if hasattr(lin, "bind_gemm"):
            lin.bind_gemm(None if backend == "torch" else kernels)
    moe.bind_kernels(kernels)


def inputs(dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(11)
    return torch.randn(TOKENS, dim, generator=gen), torch.randint(0, 512, (TOKENS,), generator=gen)


def test_a_dense_layer_launches_three_gemms_and_five_kernels_and_no_add():
    moe = moe_layer(32, shared_fp8=False)
    x, ids = inputs(moe.gate.weight.shape[1])
    bind(moe, "torch")
    with torch.no_grad():
        want = moe(x, ids)
    bind(moe, "triton")
    assert moe._shared_w13.merged is not None and moe.runs_fused_op
    with torch.no_grad(), KernelCounter() as count:
        got = moe(x, ids)
    # router, merged w1 / w3, w2; moe_route, swiglu, moe_permute, moe_up, moe_down
    assert count.aten["mm"] == 3 and count.aten["add"] == 0 and count.triton == 5
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))


@pytest.mark.parametrize("inter,merges", [(128, True), (32, False)])
@pytest.mark.parametrize("act_quant", [False, True])
def test_an_fp8_shared_expert_merges_on_the_128_row_grid_and_keeps_two_gemms_off_it(inter, merges, act_quant):
    moe = moe_layer(inter, shared_fp8=True, act_quant=act_quant)
    x, ids = inputs(moe.gate.weight.shape[1])
    bind(moe, "torch")
    with torch.no_grad():
        want = moe(x, ids)
    bind(moe, "triton")
    assert (moe._shared_w13.merged is not None) == merges
    with torch.no_grad(), KernelCounter() as merged:
        got = moe(x, ids)
    moe._shared_w13.bind(merge=False)
    with torch.no_grad(), KernelCounter() as separate:
        two = moe(x, ids)
    # merged: one GEMM launch fewer, and on the W8A8 path one fp8_act_quant of x fewer too (no norm attached rows)
    assert separate.total - merged.total == ((2 if act_quant else 1) if merges else 0)
    assert merged.aten["add"] == 0
    scale = float(want.abs().max())
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * scale)
    torch.testing.assert_close(two, want, rtol=1e-5, atol=1e-5 * scale)
