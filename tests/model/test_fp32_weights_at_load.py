"""A model loaded in bf16 holds the weights its fp32 GEMMs read (the router's, the compressors' ``wkv`` / ``wgate``)
in fp32 from the load on (``ModelWeights.cast_fp32_weights``), so the reference routes and compresses without
copying them per call, and computes exactly what it computed from the bf16 weights."""

import pytest
import torch

from atom.models.deepseek_v4.checkpoint import load_checkpoint
from atom.models.deepseek_v4.compressor import Compressor
from atom.models.deepseek_v4.make_tiny_checkpoint import make_tiny_checkpoint
from atom.models.deepseek_v4.moe import Gate


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny"))


def fp32_weights(model: torch.nn.Module) -> list[torch.Tensor]:
    """The router and compressor GEMM weights (and the routers' biases) of ``model``."""
    out = []
    for module in model.modules():
        if isinstance(module, Gate):
            out += [module.weight] + ([] if module.bias is None else [module.bias])
        elif isinstance(module, Compressor):
            out += [module.wkv.weight, module.wgate.weight]
    return out


def test_a_bf16_load_holds_the_fp32_gemm_weights_in_fp32_with_the_stored_values(tiny_dir):
    bf16 = load_checkpoint(tiny_dir, dtype=torch.bfloat16)
    fp32 = load_checkpoint(tiny_dir, dtype=torch.float32)
    weights = fp32_weights(bf16)
    assert len(weights) > 0 and all(w.dtype == torch.float32 for w in weights)
    assert all(w.float() is w for w in weights)  # the per-call .float() returns the weight itself: no copy
    assert all(torch.equal(a, b) for a, b in zip(weights, fp32_weights(fp32), strict=True))
    assert bf16.layers[0].attn.wq_a.weight.dtype == torch.bfloat16  # every other dense weight as asked


def test_the_cast_leaves_the_bf16_reference_logits_bit_for_bit(tiny_dir):
    model = load_checkpoint(tiny_dir, dtype=torch.bfloat16)
    tokens = torch.tensor([3, 17, 5, 42, 8, 11, 2, 29, 7])
    cast = model.prefill(model.new_cache(16), tokens).logits
    stored_bf16 = [m.weight for m in model.modules() if isinstance(m, Gate)] + [
        w for m in model.modules() if isinstance(m, Compressor) for w in (m.wkv.weight, m.wgate.weight)]
    for w in stored_bf16:  # back to the checkpoint's bf16 (the biases are fp32 there): the per-call cast path
        w.data = w.data.to(torch.bfloat16)
    assert torch.equal(model.prefill(model.new_cache(16), tokens).logits, cast)
