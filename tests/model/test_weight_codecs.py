"""The release's number formats on hand-computed values: FP4 e2m1 (ties to even), MXFP4 packing, e8m0 edges,
FP8 block weights and the FP8 activation quantization in front of quantized GEMMs."""

from __future__ import annotations

import torch

from atom.kernels.quant_formats import e8m0_to_float, unpack_fp4
from atom.models.deepseek_v4.layers import Linear
from atom.models.deepseek_v4.quant import (act_quant_block, dequantize_mxfp4_weight, fp4_decode, fp4_encode,
                                           fp4_roundtrip, fp8_roundtrip, quantize_fp8_weight,
                                           quantize_mxfp4_weight)


def test_fp4_ties_round_to_the_even_code():
    ties = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
    assert fp4_encode(ties).tolist() == [0, 2, 2, 4, 4, 6, 6]
    assert fp4_decode(fp4_encode(ties)).tolist() == [0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0]
    assert fp4_decode(fp4_encode(-ties)).tolist() == [-0.0, -1.0, -1.0, -2.0, -2.0, -4.0, -4.0]


def test_fp4_off_tie_values_go_to_the_nearest_code_and_large_ones_saturate():
    v = torch.tensor([0.26, 0.7, 0.8, 2.4, 2.6, 4.9, 5.1, 7.0, -9.0])
    assert fp4_decode(fp4_encode(v)).tolist() == [0.5, 0.5, 1.0, 2.0, 3.0, 4.0, 6.0, 6.0, -6.0]


def test_fp4_round_trip_rounds_the_release_ties_up():
    x = torch.tensor([[0.75, 1.75, 3.5, 6.0]])
    assert fp4_roundtrip(x, 4).tolist() == [[1.0, 2.0, 4.0, 6.0]]
    assert fp4_roundtrip(x * 2**-20, 4).tolist() == [[2**-20, 2**-19, 2**-18, 6 * 2**-20]]


def test_mxfp4_packs_low_nibble_first_with_one_power_of_two_scale_per_32_inputs():
    w = torch.zeros(1, 64)
    w[0, :4] = torch.tensor([1.0, -0.5, 6.0, 0.0])
    w[0, 32:34] = torch.tensor([12.0, 3.0])
    packed, scale = quantize_mxfp4_weight(w)
    assert packed.dtype == torch.uint8 and tuple(packed.shape) == (1, 32)
    assert packed[0, :3].tolist() == [2 | 9 << 4, 7, 0]
    assert packed[0, 16].item() == 7 | 3 << 4  # 12 / 2 = 6 -> code 7, 3 / 2 = 1.5 -> code 3
    assert scale.view(torch.uint8).tolist() == [[127, 128]]
    assert torch.equal(dequantize_mxfp4_weight(packed, scale), w)
    assert unpack_fp4(torch.tensor([2 | 9 << 4], dtype=torch.uint8)).tolist() == [1.0, -0.5]


def test_e8m0_decodes_its_edge_bytes():
    got = e8m0_to_float(torch.tensor([0, 1, 127, 128, 254, 255], dtype=torch.uint8))
    assert got[:5].tolist() == [2.0**-127, 2.0**-126, 1.0, 2.0, 2.0**127]
    assert torch.isnan(got[5])


def test_fp8_weight_scales_are_the_smallest_power_of_two_fitting_448_with_edge_blocks():
    w = torch.zeros(256, 128)
    w[0, 0], w[1, 1] = 896.0, 3.0  # block 0: amax 896 -> scale 2
    w[128, 0] = 448.0 * 2.0**100  # block 1: huge amax -> scale 2^100; an all-zero block would get 2^-126
    q, scale = quantize_fp8_weight(w)
    assert scale.view(torch.uint8).flatten().tolist() == [128, 227]
    assert q[0, 0].float().item() == 448.0 and q[1, 1].float().item() == 1.5 and q[128, 0].float().item() == 448.0
    _, zero_scale = quantize_fp8_weight(torch.zeros(3, 5))
    assert zero_scale.view(torch.uint8).tolist() == [[1]]


def test_activation_quantization_uses_blocks_of_128_and_rounds_to_e4m3():
    assert [act_quant_block(k) for k in (7168, 4096, 64, 96)] == [128, 128, 64, 32]
    x = torch.zeros(1, 128)
    x[0, 0], x[0, 1], x[0, 2] = 448.0, 0.3, -0.3
    y = fp8_roundtrip(x, 128)
    assert y[0, :3].tolist() == [448.0, 0.3125, -0.3125]  # e4m3 steps of 1/32 between 0.25 and 0.5


def test_a_quantized_linear_with_activation_quantization_multiplies_the_rounded_input():
    lin = Linear(128, 4)
    lin.set_format("fp8", act_quant=True)
    assert lin.act_block == 128 and lin.weight.dtype == torch.float8_e4m3fn and lin.scale.shape == (1, 1)
    with torch.no_grad():
        lin.weight.copy_(torch.ones(4, 128).to(torch.float8_e4m3fn))
        lin.scale.copy_(torch.tensor([[2.0]]).to(torch.float8_e8m0fnu))
    x = torch.zeros(2, 128)
    x[0, 0], x[0, 1], x[1, 0] = 448.0, 0.3, 1.0
    assert lin(x).tolist() == [[2 * 448.3125] * 4, [2.0] * 4]
    lin.act_block = 0
    assert lin(x)[0, 0].item() == torch.tensor(2 * 448.3, dtype=torch.float32).item()
