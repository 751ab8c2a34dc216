"""The shard plan of data-parallel attention: dense tensors split within a replica, routed experts over
every rank; the checkpoint check accepts the built-in model's layouts and refuses a replica size that
does not split the heads, naming it."""

from __future__ import annotations

import pytest

from atom.models.deepseek_v4.config import DeepseekV4Config
from atom.models.deepseek_v4.loader import CheckpointError
from atom.parallel.shard_loader import check_shardable
from atom.parallel.shard_plan import DROPPED, ShardPlan, Split

CFG = DeepseekV4Config.tiny()  # 8 experts, 4 heads, 2 output groups


def test_two_replicas_of_two_ranks_split_the_dense_tensors_in_the_replica_and_the_experts_over_all_four():
    plan = ShardPlan(3, 4, expert_parallel=True, n_experts=8, replicas=2)
    assert (plan.dense_rank, plan.dense_size) == (1, 2)
    assert plan.spec("embed.weight") == Split(0, 1, 2)
    assert plan.spec("layers.2.attn.wq_b.weight") == Split(0, 1, 2)
    assert plan.spec("layers.2.attn.wo_b.weight") == Split(1, 1, 2)
    assert plan.spec("layers.2.ffn.shared_experts.w2.weight") == Split(1, 1, 2)
    assert plan.expert_range() == range(6, 8)
    assert plan.spec("layers.2.ffn.experts.5.w1.weight") == DROPPED
    assert plan.spec("layers.2.ffn.experts.6.w1.weight") is None
    tp = ShardPlan(3, 4, n_experts=8, replicas=2)
    assert tp.spec("layers.2.ffn.experts.5.w1.weight") == Split(0, 3, 4)  # every expert split over all 4


def test_replicas_of_one_rank_hold_every_dense_tensor_whole_and_count_only_experts_as_sharded():
    plan = ShardPlan(1, 2, expert_parallel=True, n_experts=8, replicas=2)
    for name in ("embed.weight", "head.weight", "layers.0.attn.wq_b.weight", "layers.0.ffn.shared_experts.w1.weight"):
        assert plan.spec(name) is None and not plan.is_sharded(name)
    assert plan.is_sharded("layers.0.ffn.experts.7.w2.weight")
    assert plan.expert_range() == range(4, 8)


def test_a_replica_count_that_does_not_divide_the_ranks_is_refused():
    with pytest.raises(ValueError, match="replicas=3 must be an integer >= 1 dividing the parallel size 4"):
        ShardPlan(0, 4, replicas=3)


def test_a_replica_size_that_does_not_split_the_heads_is_refused_naming_it():
    plan = ShardPlan(0, 8, n_experts=8, expert_parallel=True, replicas=2)  # 4 ranks per replica, 2 groups
    with pytest.raises(ValueError, match="o_groups=2 is not a multiple of the tensor-parallel size of a replica 4"):
        plan.check(CFG)
    assert plan.valid_sizes(CFG, up_to=8) == [2, 4]  # 1 or 2 ranks per replica


def test_the_checkpoint_check_accepts_data_parallel_layouts_of_the_builtin_model(tiny_dir):
    for rank, size, replicas, ep in ((1, 2, 2, True), (1, 2, 2, False), (3, 4, 2, True)):
        check_shardable(tiny_dir, ShardPlan(rank, size, expert_parallel=ep, n_experts=8, replicas=replicas))
    with pytest.raises(CheckpointError, match="cannot be split over 8 ranks"):
        check_shardable(tiny_dir, ShardPlan(0, 8, expert_parallel=True, n_experts=8, replicas=2))
