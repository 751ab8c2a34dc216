"""Checkpoint I/O in the release format: round trips (bf16, sharded, fp8) and clear errors for bad checkpoints."""

from __future__ import annotations

import json

import pytest
import torch
from support.dsv4 import SEQ, run_chunks, tokens
from safetensors.torch import load_file, save_file

from atom.models.deepseek_v4 import DeepseekV4Config, DeepseekV4Model
from atom.models.deepseek_v4.checkpoint import CheckpointError, load_checkpoint, random_state_dict, read_tensors
from atom.models.deepseek_v4.make_tiny_checkpoint import main as make_tiny_main
from atom.models.deepseek_v4.quant import dequantize_fp8_weight


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny")
    assert make_tiny_main([str(out), "--seed", "0"]) == 0
    return out


def test_tiny_checkpoint_has_the_release_names_dtypes_and_config(tiny_dir):
    tensors = read_tensors(tiny_dir)
    assert len(tensors) == 367
    assert tensors["layers.0.ffn.gate.tid2eid"].dtype == torch.int64
    assert tuple(tensors["layers.0.ffn.gate.tid2eid"].shape) == (512, 2)
    assert tensors["layers.3.attn.wq_a.weight"].dtype == torch.bfloat16
    assert tensors["mtp.0.hc_head_fn"].dtype == torch.float32
    assert tuple(tensors["layers.1.attn.compressor.ape"].shape) == (4, 64)
    assert tuple(tensors["layers.2.attn.compressor.ape"].shape) == (16, 32)
    assert tuple(tensors["layers.1.attn.indexer.wq_b.weight"].shape) == (64, 32)
    assert "layers.2.ffn.gate.bias" in tensors and "layers.1.ffn.gate.bias" not in tensors
    assert not any(n.startswith("model.") for n in tensors)
    hf = json.loads((tiny_dir / "config.json").read_text())
    assert hf["compress_ratios"] == [0, 4, 16, 4, 16, 4, 0] and hf["hidden_size"] == 64


def test_loading_the_saved_random_weights_gives_the_same_logits(tiny_dir):
    cfg = DeepseekV4Config.tiny()
    direct = DeepseekV4Model(cfg)
    direct.load_state_dict(random_state_dict(cfg, 0))
    loaded = load_checkpoint(tiny_dir)
    toks = tokens()
    assert torch.equal(run_chunks(loaded, toks, [SEQ])[0], run_chunks(direct, toks, [SEQ])[0])


def test_the_same_seed_writes_the_same_weights_and_another_seed_does_not(tmp_path, tiny_dir):
    make_tiny_main([str(tmp_path / "a"), "--seed", "0"])
    make_tiny_main([str(tmp_path / "b"), "--seed", "1"])
    ref, a, b = read_tensors(tiny_dir), read_tensors(tmp_path / "a"), read_tensors(tmp_path / "b")
    assert all(torch.equal(ref[n], a[n]) for n in ref)
    assert not torch.equal(ref["layers.0.attn.wq_a.weight"], b["layers.0.attn.wq_a.weight"])


def test_a_sharded_checkpoint_with_an_index_loads_the_same_weights(tmp_path, tiny_dir):
    make_tiny_main([str(tmp_path), "--seed", "0", "--shards", "3"])
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert len(list(tmp_path.glob("*.safetensors"))) == 3
    a, b = load_checkpoint(tmp_path).state_dict(), load_checkpoint(tiny_dir).state_dict()
    assert all(torch.equal(a[n], b[n]) for n in a)


def test_an_fp8_checkpoint_keeps_fp8_weights_or_dequantizes_them_on_request(tmp_path):
    make_tiny_main([str(tmp_path), "--seed", "0", "--fp8"])
    stored = read_tensors(tmp_path)
    name = "layers.1.attn.wq_b.weight"
    assert stored[name].dtype == torch.float8_e4m3fn
    assert stored[name[:-6] + "scale"].dtype == torch.float8_e8m0fnu
    assert tuple(stored[name[:-6] + "scale"].shape) == (1, 1)
    kept = load_checkpoint(tmp_path).state_dict()
    assert kept[name].dtype == torch.float8_e4m3fn
    assert torch.equal(kept[name].view(torch.uint8), stored[name].view(torch.uint8))
    weight = load_checkpoint(tmp_path, keep_quantized=False).state_dict()[name]
    assert torch.equal(weight, dequantize_fp8_weight(stored[name], stored[name[:-6] + "scale"]))
    original = random_state_dict(DeepseekV4Config.tiny(), 0)[name]
    assert not torch.equal(weight, original)
    torch.testing.assert_close(weight, original, rtol=0.07, atol=0.01)
    embed = random_state_dict(DeepseekV4Config.tiny(), 0)["embed.weight"]
    assert torch.equal(kept["embed.weight"], embed)


def test_fp8_dequantization_scales_each_128_by_128_block():
    w = torch.ones(130, 260).to(torch.float8_e4m3fn)
    scale = torch.tensor([[1.0, 2.0, 4.0], [8.0, 16.0, 0.5]]).to(torch.float8_e8m0fnu)
    d = dequantize_fp8_weight(w, scale)
    assert d[0, 0] == 1 and d[0, 128] == 2 and d[0, 259] == 4 and d[129, 0] == 8 and d[128, 200] == 16
    assert d[129, 256] == 0.5


def _rewrite(directory, edit):
    path = directory / "model.safetensors"
    tensors = load_file(str(path))
    edit(tensors)
    save_file(tensors, str(path))


def test_a_missing_tensor_is_named_in_the_error(tmp_path):
    make_tiny_main([str(tmp_path)])
    _rewrite(tmp_path, lambda t: t.pop("layers.4.attn.compressor.norm.weight"))
    with pytest.raises(CheckpointError,
                       match=r"missing tensor layers\.4\.attn\.compressor\.norm\.weight \(expected shape \(32,\)\)"):
        load_checkpoint(tmp_path)


def test_an_unknown_tensor_is_named_in_the_error(tmp_path):
    make_tiny_main([str(tmp_path)])
    _rewrite(tmp_path, lambda t: t.update({"layers.0.attn.bogus.weight": torch.zeros(2)}))
    with pytest.raises(CheckpointError, match=r"unknown tensor layers\.0\.attn\.bogus\.weight"):
        load_checkpoint(tmp_path)


def test_a_wrong_shape_names_the_tensor_and_both_shapes(tmp_path):
    make_tiny_main([str(tmp_path)])
    _rewrite(tmp_path, lambda t: t.update({"layers.2.attn.wkv.weight": torch.zeros(31, 64, dtype=torch.bfloat16)}))
    with pytest.raises(CheckpointError, match=r"layers\.2\.attn\.wkv\.weight has shape \(31, 64\).*\(32, 64\)"):
        load_checkpoint(tmp_path)


def test_the_mtp_aliases_of_embedding_and_head_are_accepted(tmp_path, tiny_dir):
    make_tiny_main([str(tmp_path)])
    _rewrite(tmp_path, lambda t: t.update({"mtp.0.head.weight": t["head.weight"].clone(),
                                           "mtp.0.emb.tok_emb.weight": t["embed.weight"].clone()}))
    a, b = load_checkpoint(tmp_path).state_dict(), load_checkpoint(tiny_dir).state_dict()
    assert set(a) == set(b)


def test_a_truncated_file_raises_a_clear_error(tmp_path):
    make_tiny_main([str(tmp_path)])
    path = tmp_path / "model.safetensors"
    path.write_bytes(path.read_bytes()[:5000])
    with pytest.raises(CheckpointError, match="model.safetensors is unreadable or corrupted"):
        load_checkpoint(tmp_path)


def test_a_missing_shard_raises_naming_the_file(tmp_path):
    make_tiny_main([str(tmp_path), "--shards", "2"])
    (tmp_path / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(CheckpointError,
                       match=r"lists shard files that are missing: \['model-00002-of-00002.safetensors'\]"):
        load_checkpoint(tmp_path)


@pytest.mark.parametrize(("weight_map", "message"), [
    ({"embed.weight": 3}, r"'weight_map' must map each tensor name to a file name \(a string\)"),
    (["model-00001-of-00002.safetensors"], r"'weight_map' must map each tensor name to a file name"),
    ({"embed.weight": "model-00002-of-00002.safetensors"}, r"listed in model\.safetensors\.index\.json but absent "
     r"from their files: \['embed\.weight'\]"),
])
def test_a_malformed_shard_index_is_refused_saying_what_it_must_hold(tmp_path, weight_map, message):
    make_tiny_main([str(tmp_path), "--shards", "2"])
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(CheckpointError, match=message):
        load_checkpoint(tmp_path)


def test_an_fp8_weight_without_its_scale_is_rejected(tmp_path):
    make_tiny_main([str(tmp_path), "--fp8"])
    _rewrite(tmp_path, lambda t: t.pop("layers.0.attn.wq_a.scale"))
    with pytest.raises(CheckpointError, match=r"quantized tensor layers\.0\.attn\.wq_a\.weight \(F8_E4M3\) has no "
                       r"sibling scale tensor layers\.0\.attn\.wq_a\.scale"):
        load_checkpoint(tmp_path)


def test_a_config_missing_a_required_key_names_it(tmp_path):
    make_tiny_main([str(tmp_path)])
    hf = json.loads((tmp_path / "config.json").read_text())
    del hf["o_groups"]
    (tmp_path / "config.json").write_text(json.dumps(hf))
    with pytest.raises(ValueError, match="'o_groups'"):
        load_checkpoint(tmp_path)


def test_a_directory_without_weights_raises(tmp_path):
    make_tiny_main([str(tmp_path)])
    (tmp_path / "model.safetensors").unlink()
    with pytest.raises(CheckpointError, match=r"no \*\.safetensors files"):
        load_checkpoint(tmp_path)


@pytest.mark.slow  # a fresh interpreter importing torch
def test_the_make_tiny_checkpoint_module_runs_as_a_script(tmp_path):
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "atom.models.deepseek_v4.make_tiny_checkpoint", str(tmp_path),
                           "--seed", "4"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "config.json").is_file() and (tmp_path / "model.safetensors").is_file()
    assert load_checkpoint(tmp_path).cfg == DeepseekV4Config.tiny()
