"""Where the W8A8 path runs: an FP8 linear with the release numerics (``act_quant``) bound to a GPU backend's kernel
set multiplies FP8 activations (quantized in one launch, or attached by the norm before it); without the release
numerics, on the torch backend, or with input blocks spanning ranks it stays on the weight-only GEMM."""

import torch

from atom.bench.kernel_count import KernelCounter
from atom.kernels.act_quant import dequantize_act, fp8_act_quant_ref
from atom.kernels.backend import load_kernels
from atom.kernels.fp8_gemm import fp8_block_gemm_ref
from atom.kernels.quant_formats import fp8_roundtrip
from atom.models.deepseek_v4.fused_ops import bind_small_ops
from atom.models.deepseek_v4.layers import Linear, RMSNorm
from atom.models.deepseek_v4.quant import quantize_fp8_weight


def fp8_linear(gen: torch.Generator, k: int, n: int, act_quant: bool = True) -> Linear:
    lin = Linear(k, n)
    lin.set_format("fp8", act_quant=act_quant)
    w, s = quantize_fp8_weight(torch.randn(n, k, generator=gen) * 0.05)
    lin.weight.data, lin.scale.data = w, s
    return lin


def assert_within_summation_order(got: torch.Tensor, x: torch.Tensor, lin: Linear) -> None:
    """``got`` is the release numerics' result (round trip, weight-only GEMM) up to the fp32 summation order:
    twice ``(K - 1) * 2^-24 * sum_k |x_k w_k|`` over the round-tripped input."""
    xr = fp8_roundtrip(x, lin.act_block)
    want = fp8_block_gemm_ref(xr, lin.weight, lin.scale)
    w_abs = fp8_block_gemm_ref(torch.eye(lin.in_features), lin.weight, lin.scale).abs()
    bound = 2 * (lin.in_features - 1) * 2.0**-24 * (xr.abs() @ w_abs)
    assert bool(((got - want).abs() <= bound).all())


def test_an_fp8_linear_on_triton_with_the_release_numerics_quantizes_once_and_multiplies_fp8(gen):
    lin = fp8_linear(gen, 256, 130)
    lin.bind_gemm(load_kernels("triton"))
    assert lin.w8a8 is not None and lin.w8a8[1].__name__ == "w8a8_block_gemm"
    x = torch.randn(3, 5, 256, generator=gen)
    with KernelCounter() as count:
        y = lin(x)
    assert count.triton == 2 and y.shape == (3, 5, 130)  # fp8_act_quant, w8a8_block_gemm
    assert_within_summation_order(y.reshape(15, 130), x.reshape(15, 256), lin)


def test_the_weight_only_gemm_stays_without_the_release_numerics_on_torch_or_across_ranks(gen):
    plain = fp8_linear(gen, 128, 64, act_quant=False)
    plain.bind_gemm(load_kernels("triton"))
    assert plain.w8a8 is None and plain.gemm.__name__ == "fp8_block_gemm"
    on_torch = fp8_linear(gen, 128, 64)
    on_torch.bind_gemm(load_kernels("torch"))
    assert on_torch.w8a8 is None
    x = torch.randn(4, 128, generator=gen)
    assert torch.equal(on_torch(x), fp8_block_gemm_ref(fp8_roundtrip(x, 128), on_torch.weight, on_torch.scale))

    class SpanningInput(Linear):  # a row-parallel layer whose FP8 blocks span ranks overrides quantize_input
        def quantize_input(self, x: torch.Tensor) -> torch.Tensor:
            return fp8_roundtrip(x, self.act_block)

    split = SpanningInput(128, 64)
    split.set_format("fp8", act_quant=True)
    split.bind_gemm(load_kernels("triton"))
    assert split.w8a8 is None


def test_a_norm_feeding_w8a8_linears_quantizes_in_its_own_launch_and_the_linears_take_it(gen):
    k = load_kernels("triton")
    norm = RMSNorm(256, 1e-6)
    norm.weight.data = torch.rand(256, generator=gen) + 0.5
    norm.fp8_block = 128
    first, second = fp8_linear(gen, 256, 64), fp8_linear(gen, 256, 96)
    first.bind_gemm(k)
    second.bind_gemm(k)
    bind_small_ops(norm, k)
    x = torch.randn(7, 256, generator=gen)
    with KernelCounter() as count:
        y = norm(x)
        a, b = first(y), second(y)
    assert count.triton == 3  # rms_norm_fp8, then one GEMM per linear: no fp8_act_quant
    xq, xs = fp8_act_quant_ref(y, 128)
    assert torch.equal(dequantize_act(xq, xs), fp8_roundtrip(y, 128))
    assert_within_summation_order(a, y, first)
    assert_within_summation_order(b, y, second)
    with KernelCounter() as count:
        first(norm(x)[1:])  # a slice of the norm's output carries nothing: the linear quantizes it itself
    assert count.triton == 3


def test_a_marked_norm_without_a_bound_kernel_set_is_the_torch_arithmetic(gen):
    norm = RMSNorm(64, 1e-6)
    norm.weight.data = torch.rand(64, generator=gen)
    norm.fp8_block = 64
    x = torch.randn(2, 64, generator=gen)
    with KernelCounter() as count:
        y = norm(x)
    assert count.triton == 0
    assert torch.equal(y, (x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6)) * norm.weight)
