"""The quantized-weight GEMMs (FP8 block-128 and MXFP4) in the interpreter against their torch references, and
the references against whole-weight dequantization on hand-made and random weights."""

from __future__ import annotations

import pytest
import torch

from atom.kernels import backend
from atom.kernels.fp8_gemm import fp8_block_gemm, fp8_block_gemm_ref
from atom.kernels.mxfp4_gemm import mxfp4_gemm, mxfp4_gemm_ref
from atom.models.deepseek_v4.quant import (dequantize_fp8_weight, dequantize_mxfp4_weight, quantize_fp8_weight,
                                           quantize_mxfp4_weight)


def test_the_fp8_reference_applies_each_blocks_scale():
    w = torch.ones(130, 200).to(torch.float8_e4m3fn)
    scale = torch.tensor([[2.0, 4.0], [0.5, 8.0]]).to(torch.float8_e8m0fnu)
    x = torch.ones(1, 200)
    y = fp8_block_gemm_ref(x, w, scale)
    assert y[0, 0].item() == 128 * 2 + 72 * 4 and y[0, 129].item() == 128 * 0.5 + 72 * 8


def test_the_mxfp4_reference_applies_each_groups_scale():
    packed = torch.full((3, 32), 2 | 2 << 4, dtype=torch.uint8)  # every input 1.0
    scale = torch.tensor([[127, 128], [126, 127], [130, 130]], dtype=torch.uint8).view(torch.float8_e8m0fnu)
    y = mxfp4_gemm_ref(torch.ones(2, 64), packed, scale)
    assert y.tolist() == [[32 * 3.0, 32 * 1.5, 64 * 8.0]] * 2


FORMATS = {"fp8": (quantize_fp8_weight, dequantize_fp8_weight, fp8_block_gemm, fp8_block_gemm_ref),
           "mxfp4": (quantize_mxfp4_weight, dequantize_mxfp4_weight, mxfp4_gemm, mxfp4_gemm_ref)}


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("m,n,k", [(1, 64, 64), (7, 200, 320), (33, 130, 96)])
def test_triton_matches_the_reference_and_whole_weight_dequantization(gen, fmt, m, n, k):
    quantize, dequantize, kernel, reference = FORMATS[fmt]
    w, s = quantize(torch.randn(n, k, generator=gen) * 0.05)
    x = torch.randn(m, k, generator=gen)
    ref = reference(x, w, s)
    torch.testing.assert_close(ref, x @ dequantize(w, s).T, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(kernel(x, w, s), ref, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("m,n,k", [(1, 64, 128), (33, 130, 256)], ids=["one-row", "ragged-tiles"])
def test_triton_with_bf16_inputs_multiplies_on_bf16_dots_to_within_one_bf16_ulp(gen, fmt, m, n, k):
    """bf16 x and the decoded weights (e4m3 / e2m1 times a power of two) are exact in bf16 and their
    products exact in fp32, so only the fp32 summation order differs from the reference before the
    bf16 rounding of the output: one bf16 ulp (the interpreter truncates, 2^-7 relative)."""
    quantize, _, kernel, reference = FORMATS[fmt]
    w, s = quantize(torch.randn(n, k, generator=gen) * 0.05)
    x = torch.randn(m, k, generator=gen).to(torch.bfloat16)
    got, want = kernel(x, w, s), reference(x, w, s)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want.float(), rtol=2 ** -7, atol=1e-6)


def test_both_gemms_return_the_input_dtype_and_accept_uint8_scales(gen):
    q, s = quantize_fp8_weight(torch.randn(16, 128, generator=gen))
    x = torch.randn(3, 128, generator=gen, dtype=torch.bfloat16)
    assert fp8_block_gemm_ref(x, q, s.view(torch.uint8)).dtype == torch.bfloat16
    p, ps = quantize_mxfp4_weight(torch.randn(16, 128, generator=gen))
    assert torch.equal(mxfp4_gemm_ref(x, p, ps.view(torch.uint8)), mxfp4_gemm_ref(x, p, ps))


def test_bad_weights_and_scales_are_rejected_naming_what_was_expected(gen):
    q, s = quantize_fp8_weight(torch.randn(16, 256, generator=gen))
    with pytest.raises(ValueError, match=r"scale must be e8m0 .* of shape \(1, 2\)"):
        fp8_block_gemm_ref(torch.randn(2, 256), q, s[:, :1])
    with pytest.raises(ValueError, match="x has 128 features, the weight 256"):
        fp8_block_gemm(torch.randn(2, 128), q, s)
    with pytest.raises(ValueError, match="float8_e4m3fn"):
        fp8_block_gemm_ref(torch.randn(2, 256), q.float(), s)
    p, ps = quantize_mxfp4_weight(torch.randn(8, 64, generator=gen))
    with pytest.raises(ValueError, match=r"packed FP4 weight must be a 2-D uint8"):
        mxfp4_gemm_ref(torch.randn(2, 64), p.view(torch.int8), ps)
    with pytest.raises(ValueError, match=r"shape \(8, 2\) \(one per 32 inputs\)"):
        mxfp4_gemm(torch.randn(2, 64), p, ps[:, :1])


def test_the_registry_binds_both_gemms_per_backend():
    assert backend.get_kernel("fp8_block_gemm", "torch") is fp8_block_gemm_ref
    assert backend.get_kernel("fp8_block_gemm", "triton") is fp8_block_gemm
    assert backend.get_kernel("mxfp4_gemm", "torch") is mxfp4_gemm_ref
    assert backend.get_kernel("mxfp4_gemm", "triton") is mxfp4_gemm


def test_the_e4m3fnuz_rewrite_for_mi300_keeps_every_weight_value():
    from atom.kernels.aiter_gemm import to_e4m3fnuz

    codes = torch.tensor([b for b in range(256) if b not in (0x7F, 0xFF)], dtype=torch.uint8)
    weight = codes.view(torch.float8_e4m3fn).reshape(2, 127)
    scale = torch.tensor([[2.0**-3]]).to(torch.float8_e8m0fnu)
    fnuz, fnuz_scale = to_e4m3fnuz(weight, scale)
    assert fnuz.dtype == torch.float8_e4m3fnuz and fnuz_scale.tolist() == [[2.0**-2]]
    assert torch.equal(fnuz.float() * fnuz_scale, weight.float() * 2.0**-3)
    assert fnuz.view(torch.uint8)[weight.view(torch.uint8) == 0x80].tolist() == [0]
