"""MergedLinear: Linears reading one input as one GEMM over weights concatenated once at bind time (dense, FP8
block-scaled with the 128-row alignment, MXFP4, and the W8A8 path on the Triton backend), the parts' own GEMMs
otherwise, and the checkpoint's names and values untouched."""

import pytest
import torch

from atom.bench.kernel_count import KernelCounter
from atom.kernels.backend import load_kernels
from atom.models.deepseek_v4.layers import Linear
from atom.models.deepseek_v4.merged_linear import MergedLinear, merge_refusal
from atom.models.deepseek_v4.quant import quantize_fp8_weight, quantize_mxfp4_weight


@pytest.fixture
def gen() -> torch.Generator:
    return torch.Generator().manual_seed(11)


def dense(gen: torch.Generator, k: int, n: int) -> Linear:
    lin = Linear(k, n)
    lin.weight.data = torch.randint(-4, 5, (n, k), generator=gen).float() / 8  # products and sums exact in fp32
    return lin


def fp8(gen: torch.Generator, k: int, n: int, act_quant: bool = False) -> Linear:
    lin = Linear(k, n)
    lin.set_format("fp8", act_quant=act_quant)
    lin.weight.data, lin.scale.data = quantize_fp8_weight(torch.randn(n, k, generator=gen) * 0.05)
    return lin


def mxfp4(gen: torch.Generator, k: int, n: int) -> Linear:
    lin = Linear(k, n)
    lin.set_format("mxfp4")
    lin.weight.data, lin.scale.data = quantize_mxfp4_weight(torch.randn(n, k, generator=gen) * 0.05)
    return lin


def separate(parts: tuple[Linear, ...], x: torch.Tensor) -> list[torch.Tensor]:
    return [p(x) for p in parts]


def test_dense_parts_run_as_one_gemm_whose_columns_are_each_parts_product(gen):
    parts = (dense(gen, 24, 16), dense(gen, 24, 7), dense(gen, 24, 5))
    x = torch.randint(-3, 4, (6, 24), generator=gen).float()
    want = separate(parts, x)
    names = {n: t.clone() for p in parts for n, t in p.state_dict().items()}
    m = MergedLinear(*parts)
    m.bind(merge=True)
    assert m.refusal is None and m.merged is not None and m.merged.weight.shape == (28, 24)
    with KernelCounter() as count:
        got = m(x)
    assert count.aten["mm"] + count.aten["addmm"] == 1
    assert [g.shape for g in got] == [(6, 16), (6, 7), (6, 5)]
    assert all(torch.equal(g, w) for g, w in zip(got, want))
    # the parts keep their own names and values, as views into the merged weight (no second copy)
    assert {n: t for p in parts for n, t in p.state_dict().items()}.keys() == names.keys()
    assert all(torch.equal(p.weight, w) for p, w in zip(parts, m.merged.weight.split([16, 7, 5])))
    base = m.merged.weight.untyped_storage().data_ptr()
    assert all(p.weight.untyped_storage().data_ptr() == base for p in parts)


def test_a_load_into_a_merged_part_reaches_the_merged_gemm(gen):
    parts = (dense(gen, 8, 4), dense(gen, 8, 3))
    m = MergedLinear(*parts)
    m.bind(merge=True)
    parts[1].load_state_dict({"weight": torch.ones(3, 8)})
    assert torch.equal(m(torch.ones(2, 8))[1], torch.full((2, 3), 8.0))


def test_unbound_or_bound_without_merge_the_parts_run_their_own_gemms(gen):
    parts = (dense(gen, 8, 4), dense(gen, 8, 3))
    m = MergedLinear(*parts)
    x = torch.randn(3, 8, generator=gen)
    with KernelCounter() as count:
        got = m(x)
    assert count.aten["mm"] + count.aten["addmm"] == 2 and m.merged is None
    assert all(torch.equal(g, w) for g, w in zip(got, separate(parts, x)))
    m.bind(merge=True)
    m.bind(merge=False)
    assert m.merged is None and m.refusal is None


def test_fp8_parts_aligned_to_the_128_row_scale_blocks_merge_weights_and_scales(gen):
    parts = (fp8(gen, 256, 128), fp8(gen, 256, 70))
    x = torch.randn(5, 256, generator=gen)
    want = separate(parts, x)
    m = MergedLinear(*parts)
    m.bind(merge=True)
    assert m.refusal is None and m.merged.scale.shape == (2, 2) and m.merged.fmt == "fp8"
    got = m(x)
    assert all(torch.equal(g, w) for g, w in zip(got, want))


def test_fp8_parts_not_aligned_to_the_scale_blocks_stay_separate_gemms(gen):
    parts = (fp8(gen, 256, 100), fp8(gen, 256, 128))
    x = torch.randn(2, 256, generator=gen)
    want = separate(parts, x)
    m = MergedLinear(*parts)
    m.bind(merge=True)
    assert m.merged is None and "multiple of 128" in m.refusal
    assert all(torch.equal(g, w) for g, w in zip(m(x), want))


def test_mxfp4_parts_merge_row_by_row(gen):
    parts = (mxfp4(gen, 64, 10), mxfp4(gen, 64, 6))
    x = torch.randint(-3, 4, (3, 64), generator=gen).float() / 4  # products and sums exact in fp32
    want = separate(parts, x)
    m = MergedLinear(*parts)
    m.bind(merge=True)
    assert m.refusal is None and m.merged.weight.shape == (16, 32) and m.merged.scale.shape == (16, 2)
    assert all(torch.equal(g, w) for g, w in zip(m(x), want))


def test_parts_of_different_formats_inputs_or_classes_are_refused_with_the_reason(gen):
    assert "format" in merge_refusal((dense(gen, 128, 4), fp8(gen, 128, 4)))
    assert "in_features" in merge_refusal((dense(gen, 8, 4), dense(gen, 16, 4)))

    class Custom(Linear):
        pass

    assert "Custom is not a plain Linear" == merge_refusal((dense(gen, 8, 4), Custom(8, 4)))
    assert "fewer than two parts" == merge_refusal((dense(gen, 8, 4),))
    on_meta = (Linear(8, 4, device="meta"), Linear(8, 4, device="meta"))
    assert "device" in merge_refusal(on_meta)
    with pytest.raises(TypeError, match="Linear modules"):
        MergedLinear(torch.nn.Identity())


def test_fp8_parts_on_the_w8a8_path_quantize_once_and_multiply_once(gen):
    parts = (fp8(gen, 256, 128, act_quant=True), fp8(gen, 256, 64, act_quant=True))
    kernels = load_kernels("triton")
    for p in parts:
        p.bind_gemm(kernels)
    assert all(p.w8a8 is not None for p in parts)
    x = torch.randn(4, 256, generator=gen)
    want = separate(parts, x)
    m = MergedLinear(*parts)
    m.bind(merge=True)
    assert m.merged.w8a8 == parts[0].w8a8
    with KernelCounter() as count:
        got = m(x)
    assert count.triton == 2  # fp8_act_quant and w8a8_block_gemm, not two of each
    assert all(torch.equal(g, w) for g, w in zip(got, want))


def test_parts_bound_to_different_gemm_kernels_are_refused(gen):
    parts = (fp8(gen, 256, 128, act_quant=True), fp8(gen, 256, 64, act_quant=True))
    parts[0].bind_gemm(load_kernels("triton"))
    assert merge_refusal(parts) == "the parts are bound to different GEMM kernels"
