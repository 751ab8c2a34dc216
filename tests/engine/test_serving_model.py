"""The serving model beside the reference: the same parameters from the same checkpoint, no reference
object inside it, and CUDA-graph eligibility declared by the model itself."""

import pytest
import torch

from atom.config import CacheConfig, SchedulerConfig
from atom.kv.kv_layout import plan_kv_layout
from atom.model_executor.model_runner import ModelRunner
from atom.models.deepseek_v4 import attention, block, model, moe
from atom.models.deepseek_v4.checkpoint import load_checkpoint
from atom.models.deepseek_v4.config import DeepseekV4Config
from atom.models.deepseek_v4.rope import layer_frequencies
from atom.models.deepseek_v4_serving import DeepseekV4ForServing

REFERENCE_CLASSES = (model.DeepseekV4Model, block.Block, attention.Attention, moe.MoE)


@pytest.fixture(scope="module")
def serving(tiny_dir):
    return load_checkpoint(tiny_dir, model_class=DeepseekV4ForServing)


def test_the_serving_model_loads_every_parameter_of_the_reference_from_the_same_checkpoint(serving, reference):
    ours, theirs = serving.state_dict(), reference.state_dict()
    assert list(ours) == list(theirs) and len(ours) > 300
    assert all(torch.equal(ours[name], theirs[name]) for name in theirs)


def test_the_serving_model_holds_no_module_of_the_reference_model(serving):
    assert not [name for name, m in serving.named_modules() if isinstance(m, REFERENCE_CLASSES)]
    assert type(serving.layers[2].attn).__name__ == "ArenaAttention"
    assert type(serving.mtp[0]).__name__ == "ServingMTPBlock"


def test_a_layer_with_quantized_experts_is_declared_host_synced_and_rules_out_decode_graphs():
    cfg = DeepseekV4Config.tiny()
    meta = DeepseekV4ForServing(cfg, device="meta")
    assert meta.host_synced_layers == [] and not meta.supports_decode_graphs  # not on a GPU
    for expert in meta.layers[1].ffn.experts:
        expert.w1.set_format("fp8")
    assert meta.host_synced_layers == [1]
    assert not meta.layers[1].ffn.host_free and meta.layers[0].ffn.host_free


def test_the_runner_runs_only_the_serving_model(reference):
    limits = SchedulerConfig(max_num_batched_tokens=32, max_num_seqs=2, max_model_len=64)
    layout = plan_kv_layout(reference.cfg.kv_spec("fp32", include_mtp=False), CacheConfig(kv_cache_bytes=1 << 24),
                            limits)
    with pytest.raises(TypeError, match=r"serving model \(DeepseekV4ForServing\), got DeepseekV4Model"):
        ModelRunner(reference, layout, max_model_len=64)


def test_a_serving_layer_without_an_arena_says_to_bind_one():
    cfg = DeepseekV4Config.tiny()
    layer = DeepseekV4ForServing(cfg).layers[0].attn
    with pytest.raises(RuntimeError, match="call bind_arena first"):
        layer(torch.zeros(1, cfg.dim), None, None)


def test_modules_with_equal_rope_frequencies_share_one_tensor_after_binding():
    cfg = DeepseekV4Config.tiny()
    serving = DeepseekV4ForServing(cfg)
    serving.share_rope_frequencies()
    holders = [m for m in serving.modules() if isinstance(getattr(m, "freqs", None), torch.Tensor)]
    assert len({id(m.freqs) for m in holders}) == 2  # the uncompressed layers' set and the compressed layers'
    for block_ in list(serving.layers) + list(serving.mtp):
        a = block_.attn
        assert torch.equal(a.freqs, layer_frequencies(cfg, a.ratio))
        assert a.compressor is None or a.compressor.freqs is a.freqs
        assert a.indexer is None or (a.indexer.freqs is a.freqs and a.indexer.compressor.freqs is a.freqs)
    first = {bool(b.attn.ratio): b.attn.freqs for b in serving.layers}
    assert all(b.attn.freqs is first[bool(b.attn.ratio)] for b in serving.layers)
