"""The routed experts are built in their stored format (no per-Linear conversion after the build); a checkpoint
whose experts are stored otherwise still loads each Linear as stored, and a loaded model is in evaluation mode."""

from __future__ import annotations

import pytest
import torch
from support.dsv4 import tokens

from atom.models.deepseek_v4 import DeepseekV4Config
from atom.models.deepseek_v4.checkpoint import (hf_config, random_tensors, read_tensors, release_tensors,
                                                write_checkpoint)
from atom.models.deepseek_v4.layers import Linear
from atom.models.deepseek_v4.loader import load_checkpoint
from atom.models.deepseek_v4.model import DeepseekV4Model


def _layout(linear: Linear) -> list[tuple[str, tuple[int, ...], torch.dtype, bool]]:
    return [(n, tuple(t.shape), t.dtype, t.requires_grad) for n, t in linear.state_dict(keep_vars=True).items()]


def test_a_model_built_with_mxfp4_experts_has_the_layout_set_format_gives_and_a_dense_shared_expert():
    cfg = DeepseekV4Config.tiny(quant_sim=True)
    model = DeepseekV4Model(cfg, dtype=torch.bfloat16, device="meta", expert_format="mxfp4")
    formatted = Linear(cfg.dim, cfg.moe_inter_dim, dtype=torch.bfloat16, device="meta")
    formatted.set_format("mxfp4", act_quant=True)
    for block in list(model.layers) + list(model.mtp):
        for expert in block.ffn.experts:
            assert [e.fmt for e in (expert.w1, expert.w2, expert.w3)] == ["mxfp4"] * 3
            assert _layout(expert.w1) == _layout(formatted) == [
                ("weight", (cfg.moe_inter_dim, cfg.dim // 2), torch.uint8, False),
                ("scale", (cfg.moe_inter_dim, cfg.dim // 32), torch.float8_e8m0fnu, False)]
            assert expert.w1.act_block == formatted.act_block > 0 and expert.w1.gemm is not None
        assert block.ffn.shared_experts.w1.fmt == "dense" and block.attn.wq_a.fmt == "dense"
    assert len({id(e.w2.scale) for e in model.layers[0].ffn.experts}) == cfg.n_routed_experts


def test_an_unknown_expert_format_is_refused_naming_the_accepted_ones():
    with pytest.raises(ValueError, match=r"weight format 'fp4' is not one of dense, fp8, mxfp4"):
        DeepseekV4Model(DeepseekV4Config.tiny(), device="meta", expert_format="fp4")


def _expert_encoding(name: str, t: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """Layer 0's routed experts MXFP4 (the format the model is built in), layer 1's BF16 without scales, the
    other blocks' FP8; every other linear FP8."""
    if name.startswith("layers.1.ffn.experts."):
        return release_tensors(name, t)
    return release_tensors(name, t, fp8=True, fp4_experts=name.startswith("layers.0."))


@pytest.fixture(scope="module")
def mixed_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("mixed")
    cfg = DeepseekV4Config.tiny()
    pairs = (pair for name, t in random_tensors(cfg) for pair in _expert_encoding(name, t))
    return write_checkpoint(out, hf_config(cfg, fp8=True, fp4_experts=True), pairs)


def test_experts_stored_in_another_format_than_the_first_load_as_stored_and_compute_as_dequantized(mixed_dir):
    model = load_checkpoint(mixed_dir)
    formats = {name: {e.w2.fmt for e in block.ffn.experts}
               for name, block in [("layers.0", model.layers[0]), ("layers.1", model.layers[1]),
                                   ("layers.4", model.layers[4]), ("mtp.0", model.mtp[0])]}
    assert formats == {"layers.0": {"mxfp4"}, "layers.1": {"dense"}, "layers.4": {"fp8"}, "mtp.0": {"fp8"}}
    state, stored = model.state_dict(), read_tensors(mixed_dir)
    assert torch.equal(state["layers.0.ffn.experts.3.w2.weight"], stored["layers.0.ffn.experts.3.w2.weight"].view(
        torch.uint8))
    assert "layers.1.ffn.experts.3.w2.scale" not in state
    assert torch.equal(state["layers.1.ffn.experts.3.w2.weight"], stored["layers.1.ffn.experts.3.w2.weight"].float())
    assert torch.equal(state["layers.4.ffn.experts.3.w2.scale"], stored["layers.4.ffn.experts.3.w2.scale"])
    assert not any(m.training for m in model.modules())

    reference = load_checkpoint(mixed_dir, keep_quantized=False)
    assert {e.w2.fmt for block in reference.layers for e in block.ffn.experts} == {"dense"}
    toks = tokens(12)
    got = model.prefill(model.new_cache(16), toks).logits
    want = reference.prefill(reference.new_cache(16), toks).logits
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()
