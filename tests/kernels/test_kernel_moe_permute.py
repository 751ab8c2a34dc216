"""The fused MoE's one-launch permutation (``moe_permute``) against the stable sort of ``fused_moe._permute``."""

import pytest
import torch

from atom.kernels.fused_moe import _permute
from atom.kernels.moe_permute import moe_permute


@pytest.mark.parametrize("tokens, k, experts, first", [(1, 6, 256, 0), (32, 6, 256, 0), (70, 6, 16, 0),
                                                       (9, 3, 5, 4), (40, 8, 64, 10)])
def test_the_permutation_equals_the_stable_sort_of_the_held_experts_pairs(tokens, k, experts, first):
    gen = torch.Generator().manual_seed(tokens * 31 + k)
    idx = torch.randint(0, experts + first + 5, (tokens, k), generator=gen)  # some pairs on other ranks' experts
    order, offsets = moe_permute(idx, experts, first)
    ref_order, ref_offsets = _permute(idx, experts, first)
    held = int(ref_offsets[-1])
    assert offsets.dtype == torch.int32 and offsets.tolist() == ref_offsets.tolist()
    assert order[:held].tolist() == ref_order[:held].tolist()


def test_a_strided_column_slice_of_the_routing_reads_the_same_pairs():
    gen = torch.Generator().manual_seed(5)
    wide = torch.randint(0, 12, (7, 10), generator=gen, dtype=torch.int32)
    idx = wide[:, 2:8]  # not contiguous
    order, offsets = moe_permute(idx, 12)
    ref_order, ref_offsets = _permute(idx.contiguous(), 12, 0)
    assert offsets.tolist() == ref_offsets.tolist() and order.tolist() == ref_order.tolist()


def test_the_same_launch_zeroes_the_output_it_is_given():
    out = torch.full((300, 17), 3.5)  # more than one zeroing block
    moe_permute(torch.tensor([[1, 0], [0, 1]]), 2, zero=out)
    assert torch.count_nonzero(out).item() == 0


def test_the_same_launch_can_start_the_output_at_the_shared_experts_values():
    out = torch.full((300, 17), 3.5)
    init = torch.randn(300, 17, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    order, offsets = moe_permute(torch.tensor([[1, 0], [0, 1]]), 2, zero=out, init=init)
    assert torch.equal(out, init.float()) and order.tolist() == [1, 2, 0, 3] and offsets.tolist() == [0, 2, 4]


def test_bad_arguments_are_refused_with_what_is_accepted():
    with pytest.raises(ValueError, match="num_experts must be >= 1"):
        moe_permute(torch.zeros(1, 2, dtype=torch.int64), 0)
    with pytest.raises(ValueError, match="contiguous fp32"):
        moe_permute(torch.zeros(1, 2, dtype=torch.int64), 2, zero=torch.zeros(2, dtype=torch.float64))
    with pytest.raises(ValueError, match="init must be a contiguous fp32 / bf16 / fp16 tensor with zero's 4"):
        moe_permute(torch.zeros(1, 2, dtype=torch.int64), 2, zero=torch.zeros(4), init=torch.zeros(5))
    with pytest.raises(ValueError, match="init must be"):
        moe_permute(torch.zeros(1, 2, dtype=torch.int64), 2, init=torch.zeros(4))
