"""moe_route: the torch reference is the reference Gate's rule bit for bit, and the Triton kernel (interpreter)
picks the same experts in the same order and the same weights to rounding, with ties to the lower expert."""

import dataclasses

import pytest
import torch

from atom.kernels.moe_route import moe_route, moe_route_ref
from atom.bench.forward import thin_config
from atom.models.deepseek_v4.moe import Gate


@pytest.mark.parametrize("func", ["softmax", "sigmoid", "sqrtsoftplus"])
@pytest.mark.parametrize("tokens,experts,k", [(1, 8, 2), (5, 37, 6), (3, 256, 6)])
def test_the_kernel_picks_the_reference_experts_with_its_weights(tokens, experts, k, func, gen):
    logits = torch.randn(tokens, experts, generator=gen) * 4
    logits[0, :3] = 30.0  # above softplus' threshold, and a three-way tie
    bias = torch.randn(experts, generator=gen) * 0.1
    bias[:3] = 0.0
    for b in (bias, None):
        w, idx = moe_route(logits, b, None, k, func, 1.5)
        w_ref, idx_ref = moe_route_ref(logits, b, None, k, func, 1.5)
        assert torch.equal(idx, idx_ref) and idx.dtype == torch.int64
        torch.testing.assert_close(w, w_ref, rtol=2e-6, atol=1e-7)
    hashed = torch.randint(0, experts, (tokens, k), generator=gen)
    w, idx = moe_route(logits, None, hashed.to(torch.int32), k, func, 1.5)
    w_ref, idx_ref = moe_route_ref(logits, None, hashed, k, func, 1.5)
    assert torch.equal(idx, hashed)
    torch.testing.assert_close(w, w_ref, rtol=2e-6, atol=1e-7)


@pytest.mark.parametrize("ids_dtype", [torch.int64, torch.int32])
def test_with_token_ids_the_kernel_gathers_each_tokens_row_of_the_hash_table(ids_dtype, gen):
    table = torch.stack([torch.randperm(16, generator=gen)[:3] for _ in range(50)])  # [V=50, k=3]
    ids = torch.randint(0, 50, (7,), generator=gen).to(ids_dtype)
    logits = torch.randn(7, 16, generator=gen) * 3
    w_ref, idx_ref = moe_route_ref(logits, None, table, 3, "sqrtsoftplus", 1.5, token_ids=ids)
    want_w, want_idx = moe_route_ref(logits, None, table[ids.long()], 3, "sqrtsoftplus", 1.5)
    assert torch.equal(idx_ref, want_idx) and torch.equal(w_ref, want_w)
    w, idx = moe_route(logits, None, table, 3, "sqrtsoftplus", 1.5, token_ids=ids)
    assert torch.equal(idx, want_idx)
    torch.testing.assert_close(w, want_w, rtol=2e-6, atol=1e-7)


def test_ties_go_to_the_lower_expert():
    logits = torch.tensor([[1.0, 2.0, 2.0, 0.5, 2.0]])
    _, idx = moe_route(logits, None, None, 3, "sigmoid", 1.0)
    assert idx.tolist() == [[1, 2, 4]]


@pytest.mark.parametrize("hashed", [False, True])
def test_the_reference_is_the_model_gate_bit_for_bit(hashed, gen):
    cfg = dataclasses.replace(thin_config("flash"), vocab_size=50, dim=16, n_routed_experts=12, n_activated_experts=3,
                              n_hash_layers=1 if hashed else 0, score_func="sqrtsoftplus", route_scale=1.5)
    gate = Gate(cfg, 0)
    with torch.no_grad():
        gate.weight.copy_(torch.randn(12, 16, generator=gen))
        if hashed:
            gate.tid2eid.copy_(torch.randint(0, 12, (50, 3), generator=gen))
        else:
            gate.bias.copy_(torch.randn(12, generator=gen) * 0.1)
    x, ids = torch.randn(4, 16, generator=gen), torch.randint(0, 50, (4,), generator=gen)
    logits = torch.nn.functional.linear(x, gate.weight)
    w, idx = moe_route_ref(logits, None if hashed else gate.bias, gate.tid2eid[ids] if hashed else None, 3,
                           "sqrtsoftplus", 1.5)
    w_gate, idx_gate = gate(x, ids)
    assert torch.equal(idx, idx_gate) and torch.equal(w, w_gate)


def test_bad_arguments_are_refused_with_what_is_accepted():
    with pytest.raises(ValueError, match="score_func 'relu'; accepted: softmax, sigmoid, sqrtsoftplus"):
        moe_route(torch.zeros(2, 8), None, None, 2, "relu", 1.0)
    with pytest.raises(ValueError, match="topk must be an int in 1..8"):
        moe_route(torch.zeros(2, 8), None, None, 9, "sigmoid", 1.0)
    table = torch.zeros(10, 2, dtype=torch.int64)
    outside = r"token_ids holds values in \[3, 10\], outside the valid range \[0, 10\) \(the hash table.s rows\)"
    with pytest.raises(ValueError, match=outside):
        moe_route(torch.zeros(2, 8), None, table, 2, "sigmoid", 1.0, token_ids=torch.tensor([3, 10]))
    with pytest.raises(ValueError, match="token_ids must be an int32/int64 \\[2\\] tensor given with a hash table"):
        moe_route(torch.zeros(2, 8), None, None, 2, "sigmoid", 1.0, token_ids=torch.tensor([3, 1]))
    with pytest.raises(ValueError, match="hash_idx with token_ids must be an int32/int64 table \\[V, 2\\]"):
        moe_route(torch.zeros(2, 8), None, table[:, :1], 2, "sigmoid", 1.0, token_ids=torch.tensor([3, 1]))
