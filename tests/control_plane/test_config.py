"""Config objects are frozen and validated with messages naming the field."""

import dataclasses

import pytest

from atom.config import (CacheConfig, Dsv4KvSpec, EngineConfig, ParallelConfig, SchedulerConfig, load_hf_config,
                         preset_path)
from atom.models.deepseek_v4.config import DeepseekV4Config
from atom.validation import require_int


def flash_cfg():
    return load_hf_config(preset_path("deepseek_v4_flash"))


def test_flash_and_pro_specs_build_from_their_config_json():
    flash = DeepseekV4Config.from_hf_dict(flash_cfg()).kv_spec()
    pro = DeepseekV4Config.from_preset("deepseek_v4_pro").kv_spec()
    assert (len(flash.csa_layers), len(flash.hca_layers), flash.num_layers) == (21, 20, 44)
    assert (len(pro.csa_layers), len(pro.hca_layers), pro.num_layers) == (30, 31, 62)
    assert flash.compress_ratios[-1] == 0 and flash.num_mtp_layers == 1


def test_dropping_mtp_removes_its_layer():
    assert DeepseekV4Config.from_hf_dict(flash_cfg()).kv_spec(include_mtp=False).num_layers == 43


def test_a_ratio_list_of_the_wrong_length_is_rejected_with_both_counts():
    cfg = dict(flash_cfg(), compress_ratios=[0, 4])
    with pytest.raises(ValueError, match="expected num_hidden_layers"):
        DeepseekV4Config.from_hf_dict(cfg)


def test_missing_keys_are_named():
    cfg = {k: v for k, v in flash_cfg().items() if k != "head_dim"}
    with pytest.raises(ValueError, match="head_dim"):
        DeepseekV4Config.from_hf_dict(cfg)


@pytest.mark.parametrize("field,value,fragment", [
    ("block_size", 12, "multiple of every compress ratio"),
    ("row_format", "fp16", "accepted: fp8_ds_mla, bf16, fp32"),
    ("sliding_window", 0, "sliding_window"),
    ("rope_head_dim", 64, "exceeds head_dim"),
])
def test_bad_kv_spec_fields_raise_value_error(field, value, fragment):
    args = dict(compress_ratios=(0, 4, 16), sliding_window=8, head_dim=32, rope_head_dim=8, index_head_dim=16)
    args[field] = value
    with pytest.raises(ValueError, match=fragment):
        Dsv4KvSpec(**args)


def test_configs_are_frozen():
    cfg = SchedulerConfig()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.max_num_seqs = 3


def test_a_retention_interval_without_full_retain_is_rejected():
    with pytest.raises(ValueError, match="needs swa_full_retain"):
        CacheConfig(kv_cache_bytes=1 << 20, swa_retention_interval=256)


def test_a_missing_or_broken_config_json_is_reported(tmp_path):
    with pytest.raises(ValueError, match="no config.json"):
        load_hf_config(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        load_hf_config(tmp_path)
    with pytest.raises(ValueError, match="unknown preset"):
        preset_path("deepseek_v9")


def test_the_engine_config_composes_one_config_per_subsystem_and_checks_each_part():
    cfg = EngineConfig()
    assert (cfg.scheduler.max_model_len, cfg.cache.kv_cache_bytes, cfg.model.path) == (4096, 1 << 30, None)
    assert cfg.parallel == ParallelConfig(tensor_parallel_size=1, enable_expert_parallel=False)
    with pytest.raises(ValueError, match="scheduler=.* must be a SchedulerConfig"):
        EngineConfig(scheduler=CacheConfig())
    with pytest.raises(ValueError, match="tensor_parallel_size=0 must be an integer >= 1"):
        ParallelConfig(tensor_parallel_size=0)
    with pytest.raises(ValueError, match="enable_expert_parallel='yes' must be True or False"):
        ParallelConfig(enable_expert_parallel="yes")
    with pytest.raises(ValueError, match="max_model_len=1 must be an integer >= 2"):
        SchedulerConfig(max_model_len=1)


@pytest.mark.parametrize("value,maximum,message", [
    (True, None, "n=True must be an integer >= 1"),
    (2.0, None, "n=2.0 must be an integer >= 1"),
    (0, None, "n=0 must be an integer >= 1"),
    (9, 8, r"n=9 must be an integer in \[1, 8\]"),
])
def test_the_integer_check_rejects_bools_floats_and_out_of_range_values(value, maximum, message):
    with pytest.raises(ValueError, match=message):
        require_int("n", value, 1, maximum)
    assert require_int("n", 3, 1, 8) == 3


@pytest.mark.parametrize("ratios,block", [((0, 4, 0), 8), ((0, 4, 16), 16), ((0, 128, 0), 128), ((0, 0), 4)])
def test_the_default_block_size_is_the_smallest_valid_multiple_of_the_ratios(ratios, block):
    spec = Dsv4KvSpec(compress_ratios=ratios, sliding_window=8, head_dim=32, rope_head_dim=8, index_head_dim=16)
    assert spec.block_size == block
