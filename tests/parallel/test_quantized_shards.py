"""One rank's shard of a quantized checkpoint (FP8 linears, MXFP4 routed experts), loaded in this process
(no collective runs): every weight stays in its stored format, decodes to exactly the unsharded
layer's slice, and the rank holds about half of the split tensors' bytes."""

from __future__ import annotations

import pytest
import torch

from atom.bench.load import synthetic_tensors
from atom.comm import Comm
from atom.models.deepseek_v4.checkpoint import (CheckpointError, hf_config, load_checkpoint, random_state_dict,
                                                save_checkpoint, write_checkpoint)
from atom.models.deepseek_v4.config import DeepseekV4Config
from atom.models.deepseek_v4.make_tiny_checkpoint import make_tiny_checkpoint
from atom.models.deepseek_v4.quant import dequantize_fp8_weight, dequantize_mxfp4_weight
from atom.parallel.shard_loader import check_shardable, load_sharded_checkpoint
from atom.parallel.shard_plan import ShardPlan
from atom.parallel.sharding import SplitInputLinear, parameter_bytes

TINY = DeepseekV4Config.tiny()
NOT_USED = object()  # a stand-in process group: building and loading a shard runs no collective
MODES = {"tp-experts": dict(fp4_experts=False, ep=False), "expert-parallel": dict(fp4_experts=True, ep=True)}


@pytest.fixture(scope="module", params=list(MODES))
def quantized(request, tmp_path_factory):
    """(mode, checkpoint dir, unsharded model as stored, the two ranks' shards)."""
    mode = MODES[request.param]
    path = make_tiny_checkpoint(tmp_path_factory.mktemp("q"), fp8=True, fp4_experts=mode["fp4_experts"])
    plans = [ShardPlan(r, 2, True, mode["ep"], TINY.n_routed_experts) for r in range(2)]
    ranks = [load_sharded_checkpoint(path, p, Comm(p.rank, 2, NOT_USED), quant_sim=True) for p in plans]
    return request.param, path, load_checkpoint(path, quant_sim=True), plans, ranks


def decoded(module) -> torch.Tensor:
    if module.fmt == "fp8":
        return dequantize_fp8_weight(module.weight, module.scale)
    if module.fmt == "mxfp4":
        return dequantize_mxfp4_weight(module.weight, module.scale)
    return module.weight.float()


def test_each_rank_keeps_every_weight_in_its_stored_format(quantized):
    mode, _, full, _, ranks = quantized
    formats = {path: m.fmt for path, m in full.named_modules() if hasattr(m, "fmt")}
    assert formats["layers.2.ffn.experts.7.w2"] == ("mxfp4" if mode == "expert-parallel" else "fp8")
    for rank in ranks:
        held = {path: m.fmt for path, m in rank.named_modules() if hasattr(m, "fmt")}
        assert held == {p: f for p, f in formats.items() if p in held}
        assert held["layers.2.attn.wq_b"] == "fp8" and held["layers.2.attn.wo_b"] == "fp8"
        assert held["layers.2.ffn.shared_experts.w2"] == "fp8"
        assert rank.layers[2].attn.wq_b.weight.dtype == torch.float8_e4m3fn


def test_every_quantized_slice_decodes_to_the_unsharded_layers_slice(quantized):
    _, _, full, plans, ranks = quantized
    whole = dict(full.named_modules())
    checked = 0
    for plan, rank in zip(plans, ranks):
        for path, m in rank.named_modules():
            if not hasattr(m, "fmt") or m.fmt == "dense":
                continue
            want = decoded(whole[path])
            spec = plan.spec(f"{path}.weight")
            if spec is not None:
                start, stop = spec.bounds(want.shape[spec.dim])
                want = want.narrow(spec.dim, start, stop - start)
            assert torch.equal(decoded(m), want), path
            checked += 1
    assert checked > 100


def test_a_row_parallel_layer_keeps_the_unsharded_input_block_and_exchanges_its_maxima(quantized):
    _, _, full, _, ranks = quantized
    wo_b = ranks[1].layers[2].attn.wo_b
    assert isinstance(wo_b, SplitInputLinear) and wo_b.in_features == TINY.o_groups * TINY.o_lora_rank // 2
    assert (wo_b.act_block, wo_b.span) == (full.layers[2].attn.wo_b.act_block, 2)
    assert not isinstance(ranks[1].layers[2].attn.wq_b, SplitInputLinear)  # its inputs are whole


def test_each_rank_holds_about_half_of_the_split_tensors_bytes(quantized):
    _, _, full, plans, ranks = quantized
    total = parameter_bytes(full, plans[0])
    held = [parameter_bytes(rank, plan) for plan, rank in zip(plans, ranks)]
    for h in held:
        assert h.replicated == total.replicated
        assert 0.5 <= h.sharded / total.sharded <= 0.51  # scales of a block both ranks share are held twice
    assert sum(h.total for h in held) < 1.6 * total.total


def test_mxfp4_experts_split_inside_a_group_of_32_are_refused_pointing_to_expert_parallel(tmp_path):
    path = make_tiny_checkpoint(tmp_path, fp8=True, fp4_experts=True)
    with pytest.raises(CheckpointError, match=r"mxfp4 weight .*experts\.0\.w2\.weight.*--enable-expert-parallel"):
        load_sharded_checkpoint(path, ShardPlan(1, 2, True, False, TINY.n_routed_experts), Comm(1, 2, NOT_USED))


def test_an_fp8_split_that_cuts_a_scale_block_is_refused_naming_the_tensor(tmp_path):
    cfg = TINY.replace(moe_inter_dim=192)  # slices of 96 straddle the 128-row blocks
    save_checkpoint(tmp_path, cfg, random_state_dict(cfg), fp8=True)
    with pytest.raises(CheckpointError, match=r"fp8 weight .*w1\.weight \(192, 64\): slices of 96 along dim 0 cut"):
        load_sharded_checkpoint(tmp_path, ShardPlan(1, 2, False), Comm(1, 2, NOT_USED))


def test_an_fp8_split_on_whole_blocks_holds_half_the_block_scales(tmp_path):
    cfg = TINY.replace(moe_inter_dim=256)
    save_checkpoint(tmp_path, cfg, random_state_dict(cfg, seed=3), fp8=True)
    full = load_checkpoint(tmp_path)
    local = load_sharded_checkpoint(tmp_path, ShardPlan(1, 2, False), Comm(1, 2, NOT_USED))
    w1, w2 = full.layers[1].ffn.experts[6].w1, full.layers[1].ffn.shared_experts.w2
    got_w1, got_w2 = local.layers[1].ffn.experts[6].w1, local.layers[1].ffn.shared_experts.w2
    assert torch.equal(got_w1.weight.view(torch.uint8), w1.weight[128:].view(torch.uint8))
    assert torch.equal(got_w1.scale.view(torch.uint8), w1.scale[1:].view(torch.uint8))
    assert torch.equal(got_w2.weight.view(torch.uint8), w2.weight[:, 128:].view(torch.uint8))
    assert torch.equal(got_w2.scale.view(torch.uint8), w2.scale[:, 1:].view(torch.uint8))
    assert type(got_w2) is not SplitInputLinear  # each rank's 128 inputs are whole blocks


def test_with_quant_sim_a_split_whose_inputs_do_not_tile_the_fp8_input_blocks_is_refused(tmp_path):
    cfg = TINY.replace(moe_inter_dim=192)  # w2: 96 MXFP4 inputs per rank (3 groups) against FP8 input blocks of 64
    write_checkpoint(tmp_path, hf_config(cfg, fp8=True, fp4_experts=True), synthetic_tensors(cfg))  # headers matter
    plan = ShardPlan(1, 2, True, False, TINY.n_routed_experts)
    with pytest.raises(CheckpointError, match=r"experts\.0\.w2: each rank's 96 inputs of 192 do not tile the 64-wide"):
        check_shardable(tmp_path, plan, quant_sim=True)
