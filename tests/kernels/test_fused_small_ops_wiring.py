"""Where the serving model uses the fused small ops: only on a GPU backend (the Triton kernel set), never on the
torch backend, whose engine is compared with the reference model value for value."""

import torch

from atom.bench.kernel_count import KernelCounter
from atom.kernels.backend import load_kernels
from atom.models.deepseek_v4.checkpoint import random_state_dict
from atom.models.deepseek_v4.config import DeepseekV4Config
from atom.models.deepseek_v4.fused_ops import fused_small_ops
from atom.models.deepseek_v4.rope import apply_rope, rope_frequencies
from atom.models.deepseek_v4_serving import DeepseekV4ForServing


def tiny_serving() -> DeepseekV4ForServing:
    cfg = DeepseekV4Config.tiny()
    model = DeepseekV4ForServing(cfg)
    model.load_state_dict(random_state_dict(cfg, seed=0))
    return model.eval()


def test_blocks_take_the_fused_ops_from_a_triton_kernel_set_and_none_from_torch():
    block = tiny_serving().layers[0]
    block.attn.k = load_kernels("torch")
    assert block.small_ops() is None
    triton_set = load_kernels("triton")
    block.attn.k = triton_set
    assert block.small_ops() is triton_set


def test_norms_and_rotations_launch_one_kernel_inside_the_scope_and_none_outside(gen):
    norm = tiny_serving().layers[0].attn_norm
    x = torch.randn(3, norm.weight.shape[0], generator=gen)
    pos, freqs = torch.arange(3), rope_frequencies(8, 10000.0)
    with KernelCounter() as outside:
        want_norm, want_rot = norm(x), apply_rope(x, pos, freqs)
    with fused_small_ops(load_kernels("triton")), KernelCounter() as inside:
        got_norm, got_rot = norm(x), apply_rope(x, pos, freqs)
    assert outside.triton == 0 and inside.triton == 2
    torch.testing.assert_close(got_norm, want_norm, rtol=2e-6, atol=2e-6)
    torch.testing.assert_close(got_rot, want_rot, rtol=2e-6, atol=2e-6)


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
