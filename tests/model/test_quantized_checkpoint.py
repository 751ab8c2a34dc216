"""A release-format checkpoint (FP8 linears, MXFP4 routed experts, shards, MTP) loads with its weights kept as
stored, streamed, and computes what the same model with dequantized weights computes."""

from __future__ import annotations

import json

import pytest
import torch
from support.dsv4 import tokens

from atom.models.deepseek_v4 import DeepseekV4Config
from atom.models.deepseek_v4.checkpoint import read_tensors
from atom.models.deepseek_v4.loader import CheckpointError, CheckpointIndex, check_fits, load_checkpoint
from atom.models.deepseek_v4.make_tiny_checkpoint import main as make_tiny_main
from atom.models.deepseek_v4.params import load_config, meta_model
from atom.models.deepseek_v4.quant import dequantize_mxfp4_weight

EXPERT = "layers.3.ffn.experts.5.w2"


@pytest.fixture(scope="module")
def release_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("release")
    assert make_tiny_main([str(out), "--fp8", "--fp4-experts", "--shards", "3"]) == 0
    return out


@pytest.fixture(scope="module")
def quantized(release_dir):
    return load_checkpoint(release_dir)


def test_the_written_directory_has_the_release_layout_and_a_tokenizer(release_dir):
    names = {p.name for p in release_dir.iterdir()}
    assert {"config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors.index.json"} <= names
    stored = read_tensors(release_dir)
    assert stored[f"{EXPERT}.weight"].dtype == torch.int8 and tuple(stored[f"{EXPERT}.weight"].shape) == (64, 16)
    assert stored[f"{EXPERT}.scale"].dtype == torch.float8_e8m0fnu and tuple(stored[f"{EXPERT}.scale"].shape) == (64, 1)
    assert stored["layers.3.ffn.shared_experts.w2.weight"].dtype == torch.float8_e4m3fn
    assert stored["layers.3.attn.compressor.wkv.weight"].dtype == torch.bfloat16
    hf = json.loads((release_dir / "config.json").read_text())
    assert hf["expert_dtype"] == "fp4" and hf["quantization_config"]["weight_block_size"] == [128, 128]


def test_quantized_parameters_stay_fp8_and_uint8_with_the_bytes_of_the_disk(release_dir, quantized):
    state, stored = quantized.state_dict(), read_tensors(release_dir)
    assert state[f"{EXPERT}.weight"].dtype == torch.uint8
    assert torch.equal(state[f"{EXPERT}.weight"], stored[f"{EXPERT}.weight"].view(torch.uint8))
    assert state["layers.1.attn.wq_b.weight"].dtype == torch.float8_e4m3fn
    assert state["layers.1.attn.wq_b.scale"].dtype == torch.float8_e8m0fnu
    assert state["layers.1.attn.wo_a.weight"].dtype == torch.float32  # dequantized on load, as the official converter
    quant = [n for n, t in state.items() if t.dtype in (torch.uint8, torch.float8_e4m3fn, torch.float8_e8m0fnu)]
    # weight + scale of: 7 blocks x (24 routed + 3 shared + wq_a, wq_b, wkv, wo_b), 3 indexer wq_b, e/h_proj
    assert len(quant) == 2 * (7 * (24 + 3 + 4) + 3 + 2)
    resident = sum(state[n].numel() * state[n].element_size() for n in quant)
    assert resident == sum(stored[n].numel() * stored[n].element_size() for n in quant)


def test_every_logit_of_the_quantized_model_matches_the_dequantized_model(release_dir, quantized):
    reference = load_checkpoint(release_dir, keep_quantized=False)
    expert = reference.state_dict()[f"{EXPERT}.weight"]
    assert torch.equal(expert, dequantize_mxfp4_weight(quantized.state_dict()[f"{EXPERT}.weight"],
                                                         quantized.state_dict()[f"{EXPERT}.scale"]))
    toks = tokens(30)
    caches = quantized.new_cache(40), reference.new_cache(40)
    got = [quantized.prefill(caches[0], toks[:24]).logits]
    want = [reference.prefill(caches[1], toks[:24]).logits]
    for t in range(24, 30):
        got.append(quantized.extend(caches[0], toks[t : t + 1], t).logits)
        want.append(reference.extend(caches[1], toks[t : t + 1], t).logits)
    got, want = torch.cat(got), torch.cat(want)
    assert (got - want).abs().max() <= 1e-5 * want.abs().max()
    assert torch.equal(got.argmax(-1), want.argmax(-1))


def test_without_mtp_no_mtp_tensor_is_loaded(release_dir):
    model = load_checkpoint(release_dir, load_mtp=False)
    assert not any(n.startswith("mtp.") for n in model.state_dict())
    with pytest.raises(ValueError, match="load_mtp=False"):
        model.mtp_extend(model.new_cache(8), torch.zeros(1, 4, 64), torch.zeros(1), 0)


def test_an_index_reads_headers_and_slices_rows_of_one_tensor(release_dir):
    index = CheckpointIndex(release_dir)
    assert len(index.files) == 3 and index.entries["embed.weight"].dtype == "BF16"
    assert index.entries[f"{EXPERT}.weight"].shape == (64, 16) and index.entries[f"{EXPERT}.weight"].dtype == "I8"
    full = index.read("embed.weight")
    assert torch.equal(index.read("embed.weight", rows=slice(100, 164)), full[100:164])


def test_a_packed_expert_of_the_wrong_dtype_is_named_with_what_was_expected(tmp_path):
    from safetensors.torch import load_file, save_file

    make_tiny_main([str(tmp_path), "--fp4-experts"])
    path = tmp_path / "model.safetensors"
    tensors = load_file(str(path))
    tensors[f"{EXPERT}.weight"] = tensors[f"{EXPERT}.weight"].to(torch.int16)
    save_file(tensors, str(path))
    with pytest.raises(CheckpointError, match=rf"quantized tensor {EXPERT}\.weight \(I16\)|{EXPERT}\.weight has a "
                       r"scale but dtype I16"):
        load_checkpoint(tmp_path)


def test_a_real_size_checkpoint_is_refused_with_the_memory_it_needs():
    model = meta_model(load_config("flash"))
    needed = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    with pytest.raises(CheckpointError, match=rf"need {needed / 2**30:.1f} GiB on cpu but only 16\.0 GiB is free"):
        check_fits(needed, "cpu", available=16 << 30)
    check_fits(1 << 20, "cpu", available=16 << 30)


def test_the_tiny_config_round_trips_through_the_release_directory(release_dir, quantized):
    assert quantized.cfg == DeepseekV4Config.tiny()
