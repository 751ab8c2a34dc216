"""AttentionWeights.bind_fused_gemms: wq_a + wkv and wq_b + the indexer's wq_b as one GEMM each, and the grouped wo_a
writing straight into wo_b's input rows. Bound, the projections are the reference's up to the summation order of the
wider GEMMs; unbound again, they are the reference's bit for bit; the checkpoint's names and values never change."""

import torch
from support.dsv4 import build

from atom.bench.kernel_count import KernelCounter
from atom.models.deepseek_v4 import DeepseekV4Config

TIGHT = dict(rtol=1e-5, atol=1e-6)


def csa_attention():
    model = build(DeepseekV4Config.tiny())
    layer = next(b.attn for b in model.layers if b.attn.indexer is not None)
    return model, layer


@torch.no_grad()
def test_bound_fused_gemms_give_the_reference_projections_with_two_gemms_and_no_copy_fewer():
    model, attn = csa_attention()
    x = torch.randn(5, model.cfg.dim, generator=torch.Generator().manual_seed(3))
    positions = torch.tensor([0, 3, 9, 17, 40])
    names = {k: v.clone() for k, v in model.state_dict().items()}
    with KernelCounter(run_triton=False) as plain:
        want = attn.project(x, positions)
        want_out = attn.project_out(want.q, positions)
    attn.bind_fused_gemms(True)
    assert attn.in_proj.refusal is None and attn.q_proj.refusal is None and attn.wo_a_into_rows
    with KernelCounter(run_triton=False) as fused:
        got = attn.project(x, positions)
        got_out = attn.project_out(want.q, positions)
    assert plain.aten["mm"] - fused.aten["mm"] == 2 and plain.aten["clone"] - fused.aten["clone"] == 1
    for name in ("q", "kv", "index_q", "index_w"):
        torch.testing.assert_close(getattr(got, name), getattr(want, name), **TIGHT)
    torch.testing.assert_close(got_out, want_out, **TIGHT)
    state = model.state_dict()
    assert state.keys() == names.keys() and all(torch.equal(state[k], v) for k, v in names.items())
    attn.bind_fused_gemms(False)
    again = attn.project(x, positions)
    assert attn.in_proj is None and not attn.wo_a_into_rows
    assert all(torch.equal(getattr(again, n), getattr(want, n)) for n in ("q", "kv", "index_q", "index_w"))
    assert torch.equal(attn.project_out(want.q, positions), want_out)


@torch.no_grad()
def test_a_layer_without_an_indexer_merges_only_wq_a_and_wkv():
    model = build(DeepseekV4Config.tiny())
    attn = next(b.attn for b in model.layers if b.attn.indexer is None)
    attn.bind_fused_gemms(True)
    assert attn.in_proj.merged is not None
    assert attn.q_proj.merged is None and attn.q_proj.refusal == "fewer than two parts"
    x = torch.randn(2, model.cfg.dim, generator=torch.Generator().manual_seed(4))
    p = attn.project(x, torch.tensor([1, 2]))
    assert p.q.shape == (2, model.cfg.n_heads, model.cfg.head_dim) and p.index_q is None
