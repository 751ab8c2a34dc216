"""Choosing the arena's row format: ``--kv-cache-dtype``, its ``auto`` rule, validation, and the start-up line."""

import argparse

import pytest
import torch
from engine.test_engine_vs_reference import prompts, reference_logits, run_recording_logits

from atom.config import CacheConfig, SchedulerConfig
from atom.entrypoints.args import add_serve_arguments, engine_config_from_args
from atom.kv.kv_layout import KvLayout
from atom.engine_builder import describe_kv, resolve_row_format
from atom.models.deepseek_v4.config import DeepseekV4Config
from atom.sampling_params import SamplingParams


@pytest.mark.parametrize("choice,on_gpu,quantized,want", [
    ("auto", False, True, "fp32"), ("auto", True, False, "fp32"), ("auto", True, True, "fp8_ds_mla"),
    ("fp8", False, False, "fp8_ds_mla"), ("bf16", True, True, "bf16"), ("fp32", True, True, "fp32"),
])
def test_auto_stores_fp8_only_on_a_gpu_for_a_quantized_checkpoint(choice, on_gpu, quantized, want):
    assert resolve_row_format(choice, on_gpu=on_gpu, quantized=quantized) == want


def test_a_bad_kv_cache_dtype_is_rejected_with_the_accepted_values():
    with pytest.raises(ValueError, match="kv_cache_dtype='fp16'; accepted: auto, fp8, bf16, fp32"):
        CacheConfig(kv_cache_dtype="fp16")
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    assert engine_config_from_args(parser.parse_args(["--kv-cache-dtype", "fp8"])).cache.kv_cache_dtype == "fp8"
    assert engine_config_from_args(parser.parse_args([])).cache.kv_cache_dtype == "auto"
    with pytest.raises(SystemExit):
        parser.parse_args(["--kv-cache-dtype", "int4"])


def test_the_start_up_line_names_the_formats_and_the_capacity_they_give():
    spec = DeepseekV4Config.tiny().kv_spec("fp8_ds_mla", include_mtp=False)
    lay = KvLayout.for_chunks(spec, 10, SchedulerConfig(max_num_seqs=2, max_model_len=64))
    line = describe_kv(lay)
    swa, comp = lay.max_swa_pages * 16, lay.max_compressed_pages * 16
    assert line.startswith("KV cache fp8_ds_mla rows (48 B) + fp8 indexer keys (20 B): 10 chunks of ")
    assert f"= {swa:,} SWA tokens or {comp:,} compressed tokens" in line


def test_bf16_rows_bind_bf16_views_and_follow_the_reference_closely(make_engine, reference):
    engine = make_engine(kv_cache_dtype="bf16")
    views = engine.runner.views
    assert views.swa[0].dtype == views.comp[1].dtype == views.index[1].dtype == torch.bfloat16
    assert views.main_codec is None and views.csa[1].main_kv.dtype == torch.float32
    prompt = prompts()[3]
    seq = engine.sequence(engine.add_request(prompt, SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)))
    steps = run_recording_logits(engine)
    want = reference_logits(reference, seq.token_ids[:-1])
    got = torch.cat([lg for _, _, lg in steps])
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=0, atol=0.05 * float(want.abs().max()))
