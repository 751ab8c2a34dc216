"""DeepseekV4Config: HF config.json parsing, validation, the tiny preset, and meta-device parameter counts."""

from __future__ import annotations

import json
import re
from importlib import resources

import pytest
import torch

from atom.models.deepseek_v4 import DeepseekV4Config
from atom.models.deepseek_v4.params import count_parameters, meta_model


def release(name: str) -> dict:
    return json.loads(resources.files("atom.configs").joinpath(f"deepseek_v4_{name}.json").read_text())


def test_flash_config_reads_every_hf_key():
    cfg = DeepseekV4Config.from_hf_dict(release("flash"))
    assert (cfg.dim, cfg.n_layers, cfg.n_heads, cfg.head_dim, cfg.rope_head_dim) == (4096, 43, 64, 512, 64)
    assert (cfg.q_lora_rank, cfg.o_groups, cfg.o_lora_rank, cfg.window_size) == (1024, 8, 1024, 128)
    assert (cfg.index_n_heads, cfg.index_head_dim, cfg.index_topk) == (64, 128, 512)
    assert (cfg.n_routed_experts, cfg.n_activated_experts, cfg.moe_inter_dim, cfg.n_hash_layers) == (256, 6, 2048, 3)
    assert (cfg.original_seq_len, cfg.rope_factor, cfg.beta_fast, cfg.beta_slow) == (65536, 16.0, 32.0, 1.0)
    assert cfg.compress_rope_theta == 160000.0 and cfg.rope_theta == 10000.0 and cfg.route_scale == 1.5
    assert len(cfg.compress_ratios) == 44 and cfg.compress_ratios.count(4) == 21 and cfg.compress_ratios[-1] == 0
    assert cfg.n_mtp_layers == 1 and cfg.scale_fmt == "ue8m0" and not cfg.quant_sim


def test_pro_config_has_hca_first_layers():
    cfg = DeepseekV4Config.from_hf_dict(release("pro"))
    assert cfg.compress_ratios[:3] == (128, 128, 4) and cfg.compress_ratios.count(4) == 30
    assert cfg.compress_ratios.count(128) == 31 and cfg.index_topk == 1024 and cfg.route_scale == 2.5


def test_official_model_args_names_are_accepted_as_fallbacks():
    hf = release("flash")
    hf["dim"] = hf.pop("hidden_size")
    hf["window_size"] = hf.pop("sliding_window")
    cfg = DeepseekV4Config.from_hf_dict(hf)
    assert cfg.dim == 4096 and cfg.window_size == 128


@pytest.mark.parametrize("key", ["hidden_size", "compress_ratios", "index_topk", "num_hash_layers"])
def test_a_missing_required_key_raises_naming_it(key):
    hf = release("flash")
    del hf[key]
    with pytest.raises(ValueError, match=f"'{key}'"):
        DeepseekV4Config.from_hf_dict(hf)


def test_optional_keys_get_their_defaults():
    hf = release("flash")
    for key in ("rms_norm_eps", "hc_eps", "hc_sinkhorn_iters", "rope_scaling"):
        del hf[key]
    cfg = DeepseekV4Config.from_hf_dict(hf)
    assert (cfg.norm_eps, cfg.hc_eps, cfg.hc_sinkhorn_iters, cfg.original_seq_len) == (1e-6, 1e-6, 20, 0)


def test_a_non_yarn_rope_scaling_is_rejected():
    hf = release("flash")
    hf["rope_scaling"]["type"] = "linear"
    with pytest.raises(ValueError, match="rope_scaling.type='linear'"):
        DeepseekV4Config.from_hf_dict(hf)


@pytest.mark.parametrize("field,value", [
    ("dim", 0), ("n_heads", -1), ("compress_ratios", (0, 4, 16)), ("compress_ratios", (0, 4, 16, 4, 16, 4, 4)),
    ("n_shared_experts", 2), ("score_func", "relu"), ("rope_head_dim", 7), ("o_groups", 3),
    ("n_activated_experts", 9), ("n_mtp_layers", 2),
])
def test_an_invalid_value_raises_naming_the_field_and_value(field, value):
    shown = list(value) if isinstance(value, tuple) else value
    with pytest.raises(ValueError, match=re.escape(f"DeepseekV4Config.{field}={shown!r}:")):
        DeepseekV4Config.tiny(**{field: value})


def test_the_tiny_preset_matches_the_spec_table():
    cfg = DeepseekV4Config.tiny()
    assert (cfg.vocab_size, cfg.dim, cfg.n_layers, cfg.n_mtp_layers, cfg.window_size) == (512, 64, 6, 1, 8)
    assert cfg.compress_ratios == (0, 4, 16, 4, 16, 4, 0)
    assert (cfg.n_heads, cfg.head_dim, cfg.rope_head_dim, cfg.q_lora_rank) == (4, 32, 8, 32)
    assert (cfg.o_groups, cfg.o_lora_rank, cfg.index_n_heads, cfg.index_head_dim, cfg.index_topk) == (2, 16, 4, 16, 3)
    assert (cfg.n_routed_experts, cfg.n_activated_experts, cfg.moe_inter_dim, cfg.n_hash_layers) == (8, 2, 32, 2)
    assert cfg.hc_mult == 4 and cfg.nope_dim == 24 and cfg.fp8_block == 8 and cfg.fp4_block == 8


def test_the_hf_dict_round_trips():
    cfg = DeepseekV4Config.tiny()
    assert DeepseekV4Config.from_hf_dict(json.loads(json.dumps(cfg.to_hf_dict()))) == cfg


@pytest.mark.slow
def test_release_configs_build_on_meta_and_count_the_published_sizes():
    flash = DeepseekV4Config.from_hf_dict(release("flash"))
    model = meta_model(flash)
    assert all(p.device.type == "meta" for p in model.parameters())
    assert model.layers[2].attn.indexer is not None and model.layers[3].attn.indexer is None
    counts = count_parameters(flash)
    assert 280e9 < counts.total < 288e9            # published: 284B
    assert 12.5e9 < counts.activated < 13.5e9      # published: 13B
    assert counts.total_with_mtp > counts.total
    pro = count_parameters(DeepseekV4Config.from_hf_dict(release("pro")))
    assert 1.55e12 < pro.total < 1.65e12           # published: 1.6T
    assert 48e9 < pro.activated < 50e9             # published: 49B


def test_tiny_parameter_count_equals_the_materialised_model():
    cfg = DeepseekV4Config.tiny()
    from atom.models.deepseek_v4 import DeepseekV4Model
    n = sum(p.numel() for p in DeepseekV4Model(cfg).parameters())
    counts = count_parameters(cfg)
    assert counts.total_with_mtp == n
    assert counts.embedding == 512 * 64 and counts.routed_experts == 6 * 8 * 3 * 64 * 32
    assert torch.get_default_dtype() == torch.float32


def test_the_params_tool_prints_counts_for_a_named_config(capsys):
    from atom.models.deepseek_v4.params import main

    assert main(["tiny"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("tiny: total ") and "routed_experts" in out
