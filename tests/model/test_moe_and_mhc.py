"""MoE routing and mHC hyper-connections (dsv4_model.md 2.7)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from atom.models.deepseek_v4.mhc import hc_post, hc_pre, sinkhorn_split


def test_sinkhorn_comb_is_close_to_doubly_stochastic_and_gates_are_in_range():
    g = torch.Generator().manual_seed(0)
    mixes = torch.randn(5, 24, generator=g) * 3
    pre, post, comb = sinkhorn_split(mixes, torch.tensor([1.0, 1.0, 1.0]), torch.zeros(24), 4, 20, 1e-6)
    torch.testing.assert_close(comb.sum(-2), torch.ones(5, 4), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(comb.sum(-1), torch.ones(5, 4), rtol=1e-2, atol=1e-2)
    assert (pre > 0).all() and (pre < 1 + 1e-5).all()
    assert (post > 0).all() and (post < 2).all()


def test_sinkhorn_follows_softmax_then_alternating_normalisation():
    g = torch.Generator().manual_seed(1)
    mixes, scale, base = torch.randn(1, 24, generator=g), torch.tensor([0.7, 1.3, 0.9]), torch.randn(24, generator=g)
    pre, post, comb = sinkhorn_split(mixes, scale, base, 4, 3, 1e-6)
    m = mixes[0].double()
    c = torch.softmax(m[8:].reshape(4, 4) * 0.9 + base[8:].double().reshape(4, 4), dim=-1) + 1e-6
    c = c / (c.sum(0, keepdim=True) + 1e-6)
    for _ in range(2):
        c = c / (c.sum(1, keepdim=True) + 1e-6)
        c = c / (c.sum(0, keepdim=True) + 1e-6)
    torch.testing.assert_close(comb[0].double(), c, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(pre[0].double(), torch.sigmoid(m[:4] * 0.7 + base[:4].double()) + 1e-6)
    torch.testing.assert_close(post[0].double(), 2 * torch.sigmoid(m[4:8] * 1.3 + base[4:8].double()))


def test_hc_pre_and_post_mix_the_copies_as_specified():
    g = torch.Generator().manual_seed(2)
    h = torch.randn(2, 4, 8, generator=g)
    fn, scale, base = torch.randn(24, 32, generator=g) * 0.2, torch.ones(3), torch.zeros(24)
    y, post, comb = hc_pre(h, fn, scale, base, 20, 1e-6, 1e-6)
    x = h.flatten(1)
    mixes = (x @ fn.T) * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6)
    pre = torch.sigmoid(mixes[:, :4]) + 1e-6
    torch.testing.assert_close(y, (pre[:, :, None] * h).sum(1))
    f = torch.randn(2, 8, generator=g)
    out = hc_post(f, h, post, comb)
    expect = post[:, :, None] * f[:, None, :] + torch.einsum("tjk,tjd->tkd", comb, h)
    torch.testing.assert_close(out, expect)


@torch.no_grad()
def test_hash_layers_route_by_token_id_with_renormalised_unbiased_weights(bi_model):
    gate = bi_model.layers[0].ffn.gate
    assert gate.hash and gate.bias is None
    x, ids = torch.randn(3, 64, generator=torch.Generator().manual_seed(3)), torch.tensor([5, 300, 5])
    w, idx = gate(x, ids)
    assert torch.equal(idx, gate.tid2eid[ids])
    s = torch.sqrt(F.softplus(x @ gate.weight.T))
    chosen = s.gather(1, idx)
    torch.testing.assert_close(w, chosen / chosen.sum(-1, keepdim=True) * 1.5)


@torch.no_grad()
def test_router_bias_changes_selection_but_not_the_weights(bi_model):
    gate = bi_model.layers[3].ffn.gate
    assert not gate.hash
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(4))
    saved = gate.bias.clone()
    try:
        gate.bias.copy_(torch.tensor([0, 0, 0, 0, 0, 100.0, 0, 100.0]))
        w, idx = gate(x, torch.zeros(4, dtype=torch.long))
    finally:
        gate.bias.copy_(saved)
    assert idx.tolist() == [[5, 7]] * 4
    s = torch.sqrt(F.softplus(x @ gate.weight.T))[:, [5, 7]]
    torch.testing.assert_close(w, s / s.sum(-1, keepdim=True) * 1.5)


@torch.no_grad()
def test_expert_is_a_swiglu_with_the_clamp(bi_model):
    ex = bi_model.layers[0].ffn.experts[0]
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(5)) * 40  # large: the clamp is active
    gate, up = x @ ex.w1.weight.T, x @ ex.w3.weight.T
    assert gate.max() > 10 and up.abs().max() > 10
    h = F.silu(gate.clamp(max=10.0)) * up.clamp(-10.0, 10.0)
    torch.testing.assert_close(ex(x, torch.tensor([0.5, 1.0, 2.0])), (h * torch.tensor([[0.5], [1.0], [2.0]]))
                               @ ex.w2.weight.T, rtol=1e-5, atol=1e-4)


@torch.no_grad()
def test_moe_adds_the_weighted_routed_experts_and_the_shared_expert(bi_model):
    moe = bi_model.layers[2].ffn
    x, ids = torch.randn(3, 64, generator=torch.Generator().manual_seed(6)), torch.tensor([1, 2, 3])
    w, idx = moe.gate(x, ids)
    expect = moe.shared_experts(x)
    for t in range(3):
        for j in range(2):
            expect[t] += moe.experts[int(idx[t, j])](x[t : t + 1], w[t, j : j + 1])[0]
    torch.testing.assert_close(moe(x, ids), expect, rtol=1e-5, atol=1e-5)
