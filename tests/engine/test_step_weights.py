"""No per-step weight copies and no oversized mHC temporary in the serving model: the router and compressor
weights are held in fp32 once the model is bound (their GEMMs then copy nothing), and ``hc_post`` is
accumulated term by term, bit-identical to the reference's stacked sum."""

import pytest
import torch

from atom.bench.op_count import OpCounter
from atom.models.deepseek_v4.compressor import Compressor
from atom.models.deepseek_v4.mhc import hc_post
from atom.models.deepseek_v4.moe import Gate
from atom.models.deepseek_v4_serving.block import hc_post_accumulate
from support.decode_runs import thin_model


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("tokens,dim", [(1, 64), (7, 4096), (33, 128), (5, 7168)])
def test_hc_post_accumulated_term_by_term_equals_the_reference_bit_for_bit(dtype, tokens, dim):
    g = torch.Generator().manual_seed(tokens * dim)
    y = torch.randn(tokens, dim, generator=g).to(dtype)
    residual = torch.randn(tokens, 4, dim, generator=g).to(dtype)
    post, comb = torch.rand(tokens, 4, generator=g) * 2, torch.rand(tokens, 4, 4, generator=g)
    assert torch.equal(hc_post_accumulate(y, residual, post, comb), hc_post(y, residual, post, comb))


def test_router_and_compressor_weights_are_cast_to_fp32_once_and_their_gemms_copy_no_weight():
    model = thin_model().to(torch.bfloat16)
    gate = next(m for m in model.modules() if isinstance(m, Gate))
    comp = next(m for m in model.modules() if isinstance(m, Compressor))
    before = [gate.weight.detach().float(), comp.wkv.weight.detach().float(), comp.wgate.weight.detach().float()]
    x = torch.randn(3, model.cfg.dim).to(torch.bfloat16)
    with OpCounter() as bf16:
        scores_bf16, kv_bf16 = gate.scores(x), comp.project_raw(x)
    model.cast_fp32_weights()
    assert [gate.weight.dtype, comp.wkv.weight.dtype, comp.wgate.weight.dtype] == [torch.float32] * 3
    assert all(torch.equal(a, b) for a, b in zip(before, [gate.weight, comp.wkv.weight, comp.wgate.weight]))
    with OpCounter() as fp32:
        scores, kv = gate.scores(x), comp.project_raw(x)
    assert bf16.ops["_to_copy"] - fp32.ops["_to_copy"] == 3  # the three weight copies per call are gone
    assert torch.equal(scores, scores_bf16) and all(torch.equal(a, b) for a, b in zip(kv, kv_bf16))
