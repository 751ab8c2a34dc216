"""A tensor-parallel rank's serving MoE on a GPU backend (the Triton kernels, interpreter) runs the fused op on its
slice of every expert, not one GEMM per expert: over 2 gloo ranks with ``quant_sim``, where each rank's ``w2``
inputs are narrower than their FP8 block (a ``SplitInputLinear``), the layer is host-free, the ranks' rounding
of the activations in front of ``w2`` is bit for bit the unsplit layer's rounding of the same values, and the
layer's output equals the single-rank layer's (reference arithmetic, one GEMM per expert) within 1e-5 relative
(only the GEMMs' and the all-reduce's summation orders differ)."""

from __future__ import annotations

import pytest
import torch

from atom.models.deepseek_v4.checkpoint import random_state_dict, save_checkpoint
from atom.models.deepseek_v4.config import DeepseekV4Config
from atom.models.deepseek_v4.loader import load_checkpoint
from atom.models.deepseek_v4.quant import fp8_roundtrip
from atom.models.deepseek_v4_serving.model import DeepseekV4ForServing
from support.parallel_ranks import run_ranks
from support.tp_moe_rank import LAYER, moe_inputs, tp_moe_rank

pytestmark = pytest.mark.slow

#: FP8 experts (32 intermediate, 16 per rank against FP8 input blocks of 32); MXFP4 experts as the release
#: stores them (64 intermediate: 32 per rank, one whole MXFP4 group, against input blocks of 64)
FORMATS = {"fp8": (32, False), "mxfp4": (64, True)}


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_a_tensor_parallel_rank_runs_the_fused_experts_host_free_rounding_as_one_rank(tmp_path, fmt):
    inter, fp4 = FORMATS[fmt]
    cfg = DeepseekV4Config.tiny(moe_inter_dim=inter)
    path = save_checkpoint(tmp_path, cfg, random_state_dict(cfg, seed=2), fp8=True, fp4_experts=fp4)
    got = {rank: (flags, [torch.from_numpy(a) for a in arrays])
           for rank, flags, arrays in run_ranks(tp_moe_rank, (str(path),), results=2, timeout=240)}
    for rank in range(2):
        assert got[rank][0] == {"split_w2": True, "fusable": True, "host_free": True, "calls": 1}
    (out0, h0, r0), (out1, h1, r1) = got[0][1], got[1][1]
    assert torch.equal(out0, out1)  # both ranks hold the all-reduced sum
    full = load_checkpoint(path, quant_sim=True, model_class=DeepseekV4ForServing)
    block = full.layers[LAYER].ffn.experts[0].w2.act_block
    assert block == inter and h0.shape == (37 * cfg.n_activated_experts, inter // 2)  # each rank: half a block
    assert torch.equal(torch.cat([r0, r1], dim=1), fp8_roundtrip(torch.cat([h0, h1], dim=1), block))
    x, tokens = moe_inputs(cfg)
    with torch.no_grad():
        want = full.layers[LAYER].ffn(x, tokens)  # unbound: the reference's own per-expert path
    torch.testing.assert_close(out0, want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))
