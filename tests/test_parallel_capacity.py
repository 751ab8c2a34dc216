"""Per-rank weights and KV capacity under tensor parallelism: the byte count matches what a release-format
checkpoint stores, and the weight memory a rank frees as the group grows becomes its KV budget."""

from __future__ import annotations

import pytest

from atom.bench import parallel_capacity as pc
from atom.models.deepseek_v4.loader import CheckpointIndex
from atom.models.deepseek_v4.config import DeepseekV4Config
from atom.models.deepseek_v4.make_tiny_checkpoint import make_tiny_checkpoint

TINY = DeepseekV4Config.tiny()


@pytest.fixture(scope="module")
def release_tiny(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny"), fp8=True, fp4_experts=True)


def test_the_count_equals_the_checkpoints_main_layers_bytes_with_wo_a_widened_to_bf16(release_tiny):
    main = {n: e for n, e in CheckpointIndex(release_tiny).entries.items() if not n.startswith("mtp.")}  # not served
    wo_a = [e for n, e in main.items() if n.endswith("attn.wo_a.weight")]
    wo_a_scales = [e for n, e in main.items() if n.endswith("attn.wo_a.scale")]
    on_disk = sum(e.nbytes for e in main.values()) + sum(e.nbytes for e in wo_a) - sum(e.nbytes for e in wo_a_scales)
    assert pc.model_weight_bytes(TINY).total == on_disk


def test_flash_weights_shrink_per_rank_and_the_kv_budget_grows_with_them():
    cfg = DeepseekV4Config.from_preset("deepseek_v4_flash")
    whole = pc.model_weight_bytes(cfg)
    assert pc.parallel_sizes(cfg) == [1, 2, 4, 8]
    assert 140 * pc.GIB < whole.total < 160 * pc.GIB and whole.replicated < 0.02 * whole.total
    assert pc.rank_weight_bytes(whole, 8) == (-(-whole.sharded // 8), whole.replicated)
    rows = [pc.rank_capacity(cfg, whole, n, 80 * pc.GIB, 0.9, 64) for n in (1, 4, 8)]
    assert rows[0].kv_budget < 0 and rows[0].tokens == 0  # 150 GiB of weights on one 80 GiB device
    assert rows[1].weights.total - rows[2].weights.total == rows[2].kv_budget - rows[1].kv_budget
    assert 0 < rows[1].tokens < rows[2].tokens
    text = pc.format_rank_capacity("deepseek_v4_flash", rows, 80, 0.9)
    assert "| 1 | 146.6 (145.4 + 1.2) | weights do not fit | 0 |" in text
