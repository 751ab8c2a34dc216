"""Per-rank weights and KV capacity under tensor parallelism and data-parallel attention: the byte count
matches what a release-format checkpoint stores, split by how ranks hold it; the weight memory a rank
frees becomes its KV budget; replicas multiply the group's KV."""

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
    assert pc.rank_weight_bytes(whole, 8) == (whole.experts // 8, whole.in_replica // 8, whole.whole)
    rows = [pc.rank_capacity(cfg, whole, n, 80 * pc.GIB, 0.9, 64) for n in (1, 4, 8)]
    assert rows[0].kv_budget < 0 and rows[0].tokens == 0  # 150 GiB of weights on one 80 GiB device
    assert rows[1].weights.total - rows[2].weights.total == rows[2].kv_budget - rows[1].kv_budget
    assert 0 < rows[1].tokens < rows[2].tokens
    text = pc.format_rank_capacity("deepseek_v4_flash", rows, 80, 0.9)
    assert "| 1 | 146.6 (145.4 + 1.2) | weights do not fit | 0 |" in text


REPLICA_SPLIT = ("embed.weight", "head.weight", "attn.wq_b.", "attn.wo_a.weight", "attn.wo_b.", "attn.attn_sink",
                 "ffn.shared_experts.")


def test_the_count_splits_into_routed_experts_replica_split_tensors_and_whole_ones_as_the_checkpoint_does(release_tiny):
    main = {n: e for n, e in CheckpointIndex(release_tiny).entries.items() if not n.startswith("mtp.")}
    experts = sum(e.nbytes for n, e in main.items() if ".ffn.experts." in n)
    split = sum(e.nbytes * (2 if n.endswith("attn.wo_a.weight") else 1)  # wo_a: fp8 on disk, bf16 on a rank
                for n, e in main.items() if any(n == p or f".{p}" in n for p in REPLICA_SPLIT))
    whole = pc.model_weight_bytes(TINY)
    assert (whole.experts, whole.in_replica) == (experts, split)
    assert whole.experts > 0 and whole.in_replica > 0 and whole.whole > 0


def test_a_data_parallel_rank_holds_its_share_of_the_experts_and_its_replicas_share_of_the_rest():
    whole = pc.ModelWeights(experts=1600, in_replica=80, whole=7)
    assert pc.rank_weight_bytes(whole, 16, replicas=1) == (100, 5, 7)  # tensor parallel
    assert pc.rank_weight_bytes(whole, 16, replicas=4) == (100, 20, 7)  # 4 replicas of 4 ranks
    assert pc.rank_weight_bytes(whole, 16, replicas=16) == (100, 80, 7)  # one rank per replica
    assert pc.rank_weight_bytes(pc.ModelWeights(17, 5, 0), 4, 2) == (5, 3, 0)  # rounded up
    with pytest.raises(ValueError, match="16 ranks do not form 3 replicas"):
        pc.rank_weight_bytes(whole, 16, replicas=3)


def test_the_layouts_of_a_group_are_the_attention_splits_times_replicas_with_experts_over_every_rank():
    flash, pro = (DeepseekV4Config.from_preset(p) for p in ("deepseek_v4_flash", "deepseek_v4_pro"))
    assert pc.dp_layouts(flash, 8) == [(1, 8), (2, 4), (4, 2), (8, 1)]
    assert pc.dp_layouts(flash, 16) == [(2, 8), (4, 4), (8, 2), (16, 1)]  # 64 heads / 8 groups: no TP16
    assert pc.dp_layouts(pro, 16) == [(1, 16), (2, 8), (4, 4), (8, 2), (16, 1)]
    assert pc.dp_layouts(TINY, 2) == [(1, 2), (2, 1)]
    assert pc.dp_layouts(TINY, 16) == []  # 8 experts cannot be partitioned over 16 ranks; 2 groups cap TP at 2
    assert [pc.layout_name(d, t) for d, t in pc.dp_layouts(flash, 8)] == ["TP8", "DP2xTP4+EP8", "DP4xTP2+EP8",
                                                                         "DP8+EP8"]


@pytest.fixture(scope="module")
def flash():
    cfg = DeepseekV4Config.from_preset("deepseek_v4_flash")
    return cfg, pc.model_weight_bytes(cfg)


def test_flash_dp8_ep8_holds_over_7x_tp8s_kv_on_141_gib_devices_and_6_9x_on_80(flash):
    cfg, whole = flash
    for gib, ratio in ((141, 7.455), (80, 6.883)):
        tp, dp = (pc.rank_capacity(cfg, whole, 8, gib * pc.GIB, 0.9, 64, d) for d in (1, 8))
        # the replica holds all of the attention, embedding, head and shared expert: 7/8 of them more per rank
        extra = whole.in_replica - whole.in_replica // 8
        assert dp.weights.total - tp.weights.total == extra == tp.kv_budget - dp.kv_budget
        assert extra / pc.GIB == pytest.approx(7.31, abs=0.01)
        assert dp.replicas == 8 and dp.group_tokens == 8 * dp.tokens and tp.group_tokens == tp.tokens
        assert round(dp.group_tokens / tp.group_tokens, 3) == ratio
        assert pc.dp_kv_vs_tp(cfg, whole, 8, gib, 0.9, 64) == dp.group_tokens / tp.group_tokens
    # the reason the 80 GiB figure is under 7x: 8 x 45.3 GiB of KV budget against 52.6 GiB
    tp, dp = (pc.rank_capacity(cfg, whole, 8, 80 * pc.GIB, 0.9, 64, d) for d in (1, 8))
    assert (round(tp.kv_budget / pc.GIB, 1), round(dp.kv_budget / pc.GIB, 1)) == (52.6, 45.3)


def test_the_dp_table_prints_each_layout_with_the_groups_tokens_against_tp(flash):
    cfg, whole = flash
    rows = pc.dp_rows(cfg, whole, 141.0, 0.9, 64, ranks=(8,))
    text = pc.format_dp_capacity("deepseek_v4_flash", rows, 141.0, 0.9)
    assert "| 8 | TP8 | 19.4 (17.1 + 1.0 + 1.2) | 107.5 | 6,349,056 | 6,349,056 | - |" in text
    assert "| 8 | DP8+EP8 | 26.7 (17.1 + 8.4 + 1.2) | 100.2 | 5,916,800 | 47,334,400 | 7.46x |" in text
    assert len(text.splitlines()) == 3 + 4


def test_a_layout_whose_weights_do_not_fit_holds_no_kv_and_says_so():
    cfg = DeepseekV4Config.from_preset("deepseek_v4_pro")
    whole = pc.model_weight_bytes(cfg)
    rows = pc.dp_rows(cfg, whole, 80.0, 0.9, 64, ranks=(16,))
    dp16 = rows[-1]
    assert (dp16.replicas, dp16.kv_budget < 0, dp16.group_tokens) == (16, True, 0)
    text = pc.format_dp_capacity("deepseek_v4_pro", rows, 80.0, 0.9)
    assert "| 16 | DP16+EP16 | 78.4 (47.8 + 27.2 + 3.3) | weights do not fit | 0 | 0 | no KV |" in text
    tight = pc.rank_capacity(cfg, whole, 8, 141 * pc.GIB, 0.9, 64, 8)  # 0.7 GiB left: less than one 1M request
    assert tight.kv_budget > 0 and tight.layout is None and tight.tokens == 0


def test_the_capacity_report_ends_its_dp_part_with_the_summary_line():
    text = pc.dp_report(("deepseek_v4_flash", "deepseek_v4_pro"), 0.9, 64)
    assert text.splitlines()[-1] == "dp_kv_vs_tp flash_8=7.455 pro_16=10.468"
    assert text.count("data-parallel attention:") == 4
