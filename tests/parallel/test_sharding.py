"""One rank's shard, built and loaded in this process (no collectives run): which slice of each
tensor a rank holds, that the loader reads exactly those slices, and what a rank holds in bytes."""

from __future__ import annotations

import pytest
import torch

from atom.models.deepseek_v4.checkpoint import CheckpointError, load_checkpoint, random_state_dict, save_checkpoint
from atom.models.deepseek_v4.config import DeepseekV4Config
from atom.models.deepseek_v4.model import DeepseekV4Model
from atom.comm import Comm
from atom.parallel.shard_loader import load_sharded_checkpoint
from atom.parallel.shard_plan import DROPPED, ShardPlan, Split
from atom.parallel.sharding import parameter_bytes, shard_model

TINY = DeepseekV4Config.tiny()
NOT_USED = object()  # a stand-in process group: building and loading a shard runs no collective


def plan(rank=1, size=2, *, split_attention=True, ep=False, cfg=TINY):
    return ShardPlan(rank, size, split_attention, ep, cfg.n_routed_experts)


def shard(p: ShardPlan, cfg=TINY):
    return shard_model(DeepseekV4Model(cfg, device="meta"), p, Comm(p.rank, p.size, NOT_USED), "cpu")


def test_the_plan_splits_heads_groups_vocab_and_experts_and_replicates_the_rest():
    p = plan()
    assert p.spec("embed.weight") == Split(0, 1, 2) and p.spec("head.weight") == Split(0, 1, 2)
    assert p.spec("layers.3.attn.wq_b.weight") == Split(0, 1, 2)
    assert p.spec("layers.3.attn.attn_sink") == Split(0, 1, 2)
    assert p.spec("layers.3.attn.wo_a.weight") == Split(0, 1, 2)
    assert p.spec("layers.3.attn.wo_b.weight") == Split(1, 1, 2)
    assert p.spec("layers.0.ffn.experts.5.w1.weight") == Split(0, 1, 2)
    assert p.spec("layers.0.ffn.experts.5.w2.weight") == Split(1, 1, 2)
    assert p.spec("mtp.0.ffn.shared_experts.w3.weight") == Split(0, 1, 2)
    for name in ("layers.3.attn.indexer.wq_b.weight", "layers.3.attn.wkv.weight", "layers.3.attn.wq_a.weight",
                 "layers.1.attn.compressor.wkv.weight", "layers.0.ffn.gate.weight", "layers.0.hc_attn_fn", "norm.weight"):
        assert p.spec(name) is None, name


def test_expert_parallel_gives_each_rank_whole_experts_and_drops_the_others():
    p = plan(ep=True)
    assert p.expert_range() == range(4, 8)
    assert p.spec("layers.2.ffn.experts.5.w2.weight") is None
    assert p.spec("layers.2.ffn.experts.3.w2.weight") == DROPPED
    assert p.spec("layers.2.ffn.shared_experts.w2.weight") == Split(1, 1, 2)


def test_replicated_attention_keeps_every_head_on_every_rank():
    p = plan(split_attention=False, ep=True)
    assert p.spec("layers.3.attn.wq_b.weight") is None and p.spec("layers.3.attn.wo_b.weight") is None
    assert p.spec("embed.weight") == Split(0, 1, 2)


@pytest.mark.parametrize("size,field", [(3, "vocab_size"), (4, "o_groups")])
def test_a_size_that_does_not_divide_the_model_is_refused_naming_the_dimension(size, field):
    with pytest.raises(ValueError, match=f"{field}=.* is not a multiple of the parallel size {size}.*: \\[1, 2\\]"):
        plan(0, size).check(TINY)


def test_a_shard_has_its_local_shapes_head_counts_and_expert_range():
    m = shard(plan(ep=True))
    attn = m.layers[2].attn
    assert (attn.n_heads, attn.n_groups) == (2, 1)
    assert attn.wq_b.weight.shape == (2 * TINY.head_dim, TINY.q_lora_rank)
    assert attn.wo_b.weight.shape == (TINY.dim, TINY.o_lora_rank)
    assert m.embed.weight.shape == (256, TINY.dim) and m.embed.start == 256
    assert m.head.weight.shape == (256, TINY.dim)
    assert m.layers[2].ffn.expert_range == range(4, 8)
    names = set(m.state_dict())
    assert "layers.2.ffn.experts.4.w1.weight" in names and "layers.2.ffn.experts.3.w1.weight" not in names


@pytest.mark.parametrize("ep", [False, True], ids=["tp-experts", "expert-parallel"])
def test_each_rank_holds_half_of_the_sharded_bytes_and_all_of_the_replicated_ones(ep):
    full = parameter_bytes(shard(ShardPlan()), plan(ep=ep))
    ranks = [parameter_bytes(shard(plan(r, ep=ep)), plan(r, ep=ep)) for r in range(2)]
    for held in ranks:
        assert held.sharded * 2 == full.sharded
        assert held.replicated == full.replicated
    assert full.sharded > 2 * full.replicated  # the split tensors are most of the model


@pytest.mark.parametrize("ep", [False, True], ids=["tp-experts", "expert-parallel"])
def test_the_loader_reads_exactly_this_ranks_slice_of_every_tensor(tiny_dir, ep):
    full = load_checkpoint(tiny_dir).state_dict()
    p = plan(ep=ep)
    local = load_sharded_checkpoint(tiny_dir, p, Comm(1, 2, NOT_USED)).state_dict()
    for name, t in local.items():
        spec = p.spec(name)
        want = full[name] if spec is None else full[name].narrow(spec.dim, *_start_len(spec, full[name]))
        assert torch.equal(t, want), name
    dropped = [n for n in full if p.spec(n) == DROPPED]
    assert len(dropped) == (len(full) - len(local) if ep else 0)


def _start_len(spec: Split, t: torch.Tensor) -> tuple[int, int]:
    start, stop = spec.bounds(t.shape[spec.dim])
    return start, stop - start
