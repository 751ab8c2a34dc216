"""The load benchmark's checkpoint and accounting at toy size: resident bytes equal the disk bytes except for
``wo_a``, which the loader dequantizes (FP8 + scale on disk, bf16 in memory), and the router and compressor
weights, which it widens to fp32 (their GEMMs run in fp32); the many-tensors case reaches its tensor count and is
timed next to a plain safetensors read."""

import pytest
import torch

from atom.bench.load import main, many_tensor_config, measure, report, scaled_config, synthetic_tensors, tensor_count
from atom.models.deepseek_v4.checkpoint import hf_config, write_checkpoint


def test_the_synthetic_release_checkpoint_loads_and_its_bytes_are_accounted(tmp_path):
    cfg = scaled_config(256, 4)
    write_checkpoint(tmp_path, hf_config(cfg, fp8=True, fp4_experts=True), synthetic_tensors(cfg),
                     shard_bytes=1 << 20)
    r = measure(tmp_path, torch.bfloat16)
    assert r["shards"] > 2
    widened = sum(t.numel() * 2 for name, t in synthetic_tensors(cfg) if t.dtype == torch.bfloat16 and (
        name.endswith(("ffn.gate.weight", "compressor.wkv.weight", "compressor.wgate.weight"))))
    assert widened > 0
    wo_a = cfg.o_groups * cfg.o_lora_rank * (cfg.n_heads * cfg.head_dim // cfg.o_groups)
    wo_a_scales = -(-cfg.o_groups * cfg.o_lora_rank // 128) * -(-cfg.n_heads * cfg.head_dim // cfg.o_groups // 128)
    blocks = cfg.n_layers + cfg.n_mtp_layers
    assert r["resident_bytes"] == r["disk_tensor_bytes"] + blocks * (wo_a - wo_a_scales) + widened
    assert r["largest_tensor_bytes"] == cfg.vocab_size * cfg.dim * 2  # the bf16 embedding / head
    assert "resident parameters" in report(r) and "peak RSS" in report(r)


def test_the_many_tensor_case_has_the_fewest_experts_that_reach_the_count_and_loads_next_to_a_plain_read(tmp_path):
    cfg = many_tensor_config(1000, 128)
    assert tensor_count(cfg) >= 1000 > tensor_count(cfg.replace(n_routed_experts=cfg.n_routed_experts - 1))
    write_checkpoint(tmp_path, hf_config(cfg, fp8=True, fp4_experts=True), synthetic_tensors(cfg), shards=4)
    r = measure(tmp_path, torch.bfloat16)
    assert (r["shards"], r["tensors"]) == (4, tensor_count(cfg))
    assert r["plain_read_seconds"] > 0 and r["plain_read_cpu_seconds"] > 0 and r["load_cpu_seconds"] > 0
    assert "load / plain read" in report(r)


def test_the_bench_refuses_a_shard_count_below_one():
    with pytest.raises(SystemExit) as exc:
        main(["--tensors", "100", "--shards", "0"])
    assert exc.value.code == 2
