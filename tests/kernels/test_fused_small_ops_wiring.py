"""Where the serving model uses the fused small ops: bound once per module (``ServingBlock.bind_small_ops``), only
on a GPU backend (the Triton kernel set), never on the torch backend, whose engine is compared with the reference
model value for value; the free functions run the kernel set their caller passes."""

import torch

from atom.bench.kernel_count import KernelCounter
from atom.kernels.backend import load_kernels
from atom.models.deepseek_v4.checkpoint import random_state_dict
from atom.models.deepseek_v4.config import DeepseekV4Config
from atom.models.deepseek_v4.fused_ops import SmallOpsUser, bind_small_ops, fused_small_ops_for
from atom.models.deepseek_v4.layers import rms_normalize
from atom.models.deepseek_v4.rope import apply_rope, normed_rope, rope_frequencies
from atom.models.deepseek_v4_serving import DeepseekV4ForServing


def tiny_serving() -> DeepseekV4ForServing:
    cfg = DeepseekV4Config.tiny()
    model = DeepseekV4ForServing(cfg)
    model.load_state_dict(random_state_dict(cfg, seed=0))
    return model.eval()


def bound_users(root: torch.nn.Module) -> dict[str, object]:
    """``{module path: its bound kernel set}`` of every small-ops user under ``root``."""
    return {name: m.small_ops for name, m in root.named_modules() if isinstance(m, SmallOpsUser)}


def test_a_triton_kernel_set_is_bound_as_the_fused_small_ops_and_a_torch_one_is_not():
    triton_set = load_kernels("triton")
    assert fused_small_ops_for(load_kernels("torch")) is None and fused_small_ops_for(None) is None
    assert fused_small_ops_for(triton_set) is triton_set


def test_binding_a_block_reaches_its_norms_attention_compressors_and_indexer_and_unbinding_restores_torch():
    model = tiny_serving()
    block = next(b for b in model.layers if b.attn.indexer is not None)  # a CSA layer: every kind of user
    triton_set = load_kernels("triton")
    assert set(bound_users(block).values()) == {None}
    block.bind_small_ops(triton_set)
    users = bound_users(block)
    assert {"", "attn_norm", "ffn_norm", "attn", "attn.q_norm", "attn.kv_norm", "attn.compressor",
            "attn.compressor.norm", "attn.indexer", "attn.indexer.compressor",
            "attn.indexer.compressor.norm"} == set(users)
    assert all(k is triton_set for k in users.values())
    other = next(b for b in model.layers if b is not block)
    assert set(bound_users(other).values()) == {None}  # bound per block
    block.bind_small_ops(None)
    assert set(bound_users(block).values()) == {None}
    assert (block.attn_norm.fp8_block, block.attn.q_norm.fp8_block, block.ffn_norm.fp8_block) == (0, 0, 0)


def test_the_mtp_block_binds_its_input_norms_but_not_the_collapse_norm_that_runs_with_the_head():
    block = tiny_serving().mtp[0]
    triton_set = load_kernels("triton")
    block.bind_small_ops(triton_set)
    assert block.enorm.small_ops is triton_set and block.hnorm.small_ops is triton_set
    assert block.small_ops is triton_set and block.attn.small_ops is triton_set
    assert block.norm.small_ops is None


def test_norms_and_rotations_launch_one_kernel_when_bound_or_passed_and_none_otherwise(gen):
    norm = tiny_serving().layers[0].attn_norm
    x = torch.randn(3, norm.weight.shape[0], generator=gen)
    pos, freqs = torch.arange(3), rope_frequencies(8, 10000.0)
    with KernelCounter() as outside:
        want_norm, want_rot = norm(x), apply_rope(x, pos, freqs)
        want_unit, want_normed_rot = rms_normalize(x, 1e-6), normed_rope(x, None, 1e-6, pos, freqs)
    triton_set = load_kernels("triton")
    bind_small_ops(norm, triton_set)
    with KernelCounter() as inside:
        got_norm, got_rot = norm(x), apply_rope(x, pos, freqs, kernels=triton_set)
        got_unit, got_normed_rot = (rms_normalize(x, 1e-6, kernels=triton_set),
                                    normed_rope(x, None, 1e-6, pos, freqs, kernels=triton_set))
    with KernelCounter() as unpassed:
        assert torch.equal(apply_rope(x, pos, freqs), want_rot)  # the bound norm binds nothing else
    assert outside.triton == 0 and inside.triton == 4 and unpassed.triton == 0
    for got, want in ((got_norm, want_norm), (got_rot, want_rot), (got_unit, want_unit),
                      (got_normed_rot, want_normed_rot)):
        torch.testing.assert_close(got, want, rtol=2e-6, atol=2e-6)
    bind_small_ops(norm, None)
    assert torch.equal(norm(x), want_norm)


def test_the_moe_routes_with_the_kernel_on_triton_and_with_the_gate_on_torch(gen):
    model = tiny_serving()
    for layer in (0, len(model.layers) - 1):  # a hash-routed layer and a top-k layer
        moe = model.layers[layer].ffn
        x = torch.randn(5, model.cfg.dim, generator=gen)
        ids = torch.randint(0, model.cfg.vocab_size, (5,), generator=gen)
        want_w, want_idx = moe.gate(x, ids)
        moe.bind_kernels(load_kernels("torch"))
        torch_w, torch_idx = moe.route(x, ids)
        assert torch.equal(torch_w, want_w) and torch.equal(torch_idx, want_idx)
        moe.bind_kernels(load_kernels("triton"))
        with KernelCounter() as count:
            w, idx = moe.route(x, ids)
        assert count.triton == 1 and torch.equal(idx, want_idx)
        torch.testing.assert_close(w, want_w, rtol=2e-6, atol=1e-7)
