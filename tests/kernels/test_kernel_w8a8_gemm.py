"""The W8A8 GEMM and the FP8 activation quantizers (alone and fused after RMSNorm) in the interpreter against their
torch references, and the references against the release numerics (``fp8_roundtrip`` then the weight-only GEMM)."""

from __future__ import annotations

import pytest
import torch

from atom.kernels.act_quant import (dequantize_act, fp8_act_quant, fp8_act_quant_ref, rms_norm_fp8,
                                    rms_norm_fp8_ref)
from atom.kernels.fp8_gemm import fp8_block_gemm_ref
from atom.kernels.quant_formats import fp8_roundtrip
from atom.kernels.rms_norm import rms_norm_ref
from atom.kernels.w8a8_gemm import w8a8_block_gemm, w8a8_block_gemm_ref
from atom.models.deepseek_v4.quant import quantize_fp8_weight

# (M, N, K, activation block): one token, M not a multiple of any row tile, N not a multiple of 128, K multiples of
# 128 with the release's 128-wide blocks, and the narrow blocks of the test models.
SHAPES = [(1, 192, 256, 128), (37, 130, 384, 128), (70, 256, 128, 128), (5, 96, 64, 64), (19, 40, 32, 32)]
DTYPES = [torch.float32, torch.bfloat16]


def _operands(gen: torch.Generator, m: int, n: int, k: int, block: int, dtype: torch.dtype):
    x = (torch.randn(m, k, generator=gen) * torch.rand(m, 1, generator=gen) * 8).to(dtype)
    x[0, :block] = 0.0  # an all-zero block takes the 1e-4 floor's scale
    w, s = quantize_fp8_weight(torch.randn(n, k, generator=gen) * 0.05)
    return x, w, s


def _summation_bound(xq, xs, w, s) -> torch.Tensor:
    """Twice ``(K - 1) * 2^-24 * sum_k |x_k w_k|``: two fp32 sums of the same exact products in different orders."""
    x = dequantize_act(xq, xs).double()
    wd = fp8_block_gemm_ref(torch.eye(w.shape[1]), w, s).double()  # the dequantized weight, transposed
    return 2 * (w.shape[1] - 1) * 2.0**-24 * (x.abs() @ wd.abs())


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("m,n,k,block", SHAPES)
def test_the_reference_is_the_round_trip_then_the_weight_only_gemm_bit_for_bit(gen, m, n, k, block, dtype):
    x, w, s = _operands(gen, m, n, k, block, dtype)
    xq, xs = fp8_act_quant_ref(x, block)
    assert torch.equal(dequantize_act(xq, xs).to(dtype), fp8_roundtrip(x, block))
    assert torch.equal(w8a8_block_gemm_ref(xq, xs, w, s, dtype), fp8_block_gemm_ref(fp8_roundtrip(x, block), w, s))


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("m,n,k,block", SHAPES)
def test_the_triton_gemm_equals_the_reference_up_to_the_fp32_summation_order(gen, m, n, k, block, dtype):
    x, w, s = _operands(gen, m, n, k, block, dtype)
    xq, xs = fp8_act_quant_ref(x, block)
    got, want = w8a8_block_gemm(xq, xs, w, s, dtype), w8a8_block_gemm_ref(xq, xs, w, s, dtype)
    assert got.dtype == dtype and got.shape == (m, n)
    # bf16: the two fp32 sums may also round to neighbouring bf16 values
    rounding = 0.0 if dtype == torch.float32 else 2.0**-8
    bound = _summation_bound(xq, xs, w, s) + want.double().abs() * rounding
    assert bool(((got.double() - want.double()).abs() <= bound).all())


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("m,k,block", [(1, 256, 128), (37, 384, 128), (5, 64, 64), (130, 32, 32), (3, 96, 16)])
def test_the_triton_quantizer_gives_the_reference_bytes_and_scales(gen, m, k, block, dtype):
    x, _, _ = _operands(gen, m, 8, k, block, dtype)
    xq, xs = fp8_act_quant(x, block)
    want_q, want_s = fp8_act_quant_ref(x, block)
    assert torch.equal(xq.view(torch.uint8), want_q.view(torch.uint8)) and torch.equal(xs, want_s)
    assert xs.shape == (m, k // block)


def test_the_quantizer_reads_rows_of_a_strided_view(gen):
    base = torch.randn(6, 320, generator=gen)
    view = base[:, 64:]  # rows 320 apart, 256 wide
    xq, xs = fp8_act_quant(view, 128)
    want_q, want_s = fp8_act_quant_ref(view.contiguous(), 128)
    assert torch.equal(xq.view(torch.uint8), want_q.view(torch.uint8)) and torch.equal(xs, want_s)


@pytest.mark.parametrize("dtype", DTYPES, ids=["fp32", "bf16"])
@pytest.mark.parametrize("m,d,block,weighted", [(1, 256, 128, True), (45, 384, 128, True), (7, 64, 64, False),
                                                (33, 32, 32, True)])
def test_the_fused_norm_quantizes_its_own_rounded_output(gen, m, d, block, weighted, dtype):
    """``y`` is the RMSNorm of the contract (the last fp32 bits may differ from torch's mean: the sum is a tree
    here); the FP8 part is exactly the quantization of that ``y``, as a linear taking ``y`` would make it."""
    x = (torch.randn(m, d, generator=gen) * 3).to(dtype)
    weight = (torch.rand(d, generator=gen) + 0.5).to(dtype) if weighted else None
    y, xq, xs = rms_norm_fp8(x, weight, 1e-6, block)
    ref_y, _, _ = rms_norm_fp8_ref(x, weight, 1e-6, block)
    assert y.dtype == dtype
    # fp32: a few ulps; bf16: one bf16 ulp at most (the fp32 values differ in their last bits before the rounding)
    tol = dict(rtol=2e-6, atol=2e-6) if dtype == torch.float32 else dict(rtol=2.0**-8, atol=0.0)
    torch.testing.assert_close(y.float(), ref_y.float(), **tol)
    want_q, want_s = fp8_act_quant_ref(y, block)
    assert torch.equal(xq.view(torch.uint8), want_q.view(torch.uint8)) and torch.equal(xs, want_s)
    assert torch.equal(rms_norm_fp8_ref(x, weight, 1e-6, block)[0], rms_norm_ref(x, weight, 1e-6))


def test_empty_inputs_give_empty_outputs():
    w, s = quantize_fp8_weight(torch.ones(130, 128))
    xq, xs = fp8_act_quant(torch.zeros(0, 128), 128)
    assert xq.shape == (0, 128) and xs.shape == (0, 1)
    assert w8a8_block_gemm(xq, xs, w, s, torch.float32).shape == (0, 130)
    y, q, sc = rms_norm_fp8(torch.zeros(0, 128), None, 1e-6, 128)
    assert y.shape == (0, 128) and q.shape == (0, 128) and sc.shape == (0, 1)


@pytest.mark.parametrize("fn", [w8a8_block_gemm, w8a8_block_gemm_ref], ids=["triton", "reference"])
def test_bad_operands_are_refused_naming_what_is_accepted(fn):
    w, s = quantize_fp8_weight(torch.ones(64, 256))
    xq, xs = fp8_act_quant_ref(torch.ones(2, 256), 128)
    with pytest.raises(ValueError, match="xq has dtype"):
        fn(xq.float(), xs, w, s, torch.float32)
    with pytest.raises(ValueError, match="xs must be fp32"):
        fn(xq, xs[:, :1].contiguous().expand(2, 3).contiguous(), w, s, torch.float32)
    with pytest.raises(ValueError, match="power of two in 16..128"):
        fn(xq, torch.ones(2, 32), w, s, torch.float32)
    with pytest.raises(ValueError, match="out_dtype must be one of"):
        fn(xq, xs, w, s, torch.float16)
    with pytest.raises(ValueError, match="the weight 128"):
        fn(xq, xs, *quantize_fp8_weight(torch.ones(64, 128)), torch.float32)


@pytest.mark.parametrize("fn", [fp8_act_quant, fp8_act_quant_ref], ids=["triton", "reference"])
def test_a_block_that_does_not_tile_the_row_is_refused(fn):
    with pytest.raises(ValueError, match="power of two in 16..128 dividing the row width 96"):
        fn(torch.ones(2, 96), 64)
    with pytest.raises(ValueError, match="got 8"):
        fn(torch.ones(2, 96), 8)
    with pytest.raises(ValueError, match="x has dtype"):
        fn(torch.ones(2, 96, dtype=torch.float16), 32)
