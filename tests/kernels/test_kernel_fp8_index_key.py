"""FP8 indexer-key codec: hand-computed bytes, Triton vs reference bit-exact, extremes, and FP4 keys kept exactly."""

import struct

import pytest
import torch
from support.kernels import assert_same_bits
from support.row_codecs import assert_encode_refuses_bad_rows, assert_encodes_into_strided_rows

from atom.kernels.fp8_index_key import (DSV4_INDEX_LAYOUT, Fp8IndexKeyLayout, fp8_index_key_dequantize,
                                        fp8_index_key_dequantize_ref, fp8_index_key_quantize,
                                        fp8_index_key_quantize_ref)
from atom.models.deepseek_v4.quant import fp4_roundtrip, hadamard_rotate

TINY = Fp8IndexKeyLayout(dim=16)


def e4m3(v: float) -> int:
    return torch.tensor(v).to(torch.float8_e4m3fn).view(torch.uint8).item()


def test_the_real_key_is_132_bytes():
    assert DSV4_INDEX_LAYOUT.row_bytes == 132 and TINY.row_bytes == 20


def test_reference_encodes_a_hand_computed_key():
    x = torch.zeros(1, 16)
    x[0, 0], x[0, 1], x[0, 15] = 3.0, -1.5, 0.25  # amax 3 -> e = ceil(log2(3 / 448)) = -7, values * 128
    row = fp8_index_key_quantize_ref(x, layout=TINY)[0]
    assert row[0].item() == e4m3(384.0) == 0x7C and row[1].item() == e4m3(-192.0) == 0xF4
    assert row[15].item() == e4m3(32.0) == 0x60 and row[2:15].tolist() == [0] * 13
    assert bytes(row[16:].tolist()) == struct.pack("<f", 2.0 ** -7)  # the scale, little-endian fp32


def test_the_amax_floor_sets_the_scale_of_a_zero_or_tiny_key():
    x = torch.zeros(2, 16)
    x[1, 3] = 1e-9  # below the floor: scale from 1e-4 / 448 -> 2**-22; 1e-9 * 2**22 = 2.15 * 2**-9 -> subnormal 2
    rows = fp8_index_key_quantize_ref(x, layout=TINY)
    assert rows[0, :16].tolist() == [0] * 16
    assert rows[1, :16].tolist() == [0, 0, 0, 0x02] + [0] * 12
    for r in range(2):
        assert bytes(rows[r, 16:].tolist()) == struct.pack("<f", 2.0 ** -22)


def test_extreme_values_round_trip_within_an_fp8_step_and_saturate_nowhere(gen):
    x = torch.randn(6, 16, generator=gen) * torch.tensor([1e-3, 1.0, 448.0, 1e6, 3e30, 1e-2])[:, None]
    back = fp8_index_key_dequantize_ref(fp8_index_key_quantize_ref(x, layout=TINY), layout=TINY)
    amax = x.abs().amax(-1, keepdim=True)
    assert bool(((back - x).abs() <= amax * 2.0 ** -4).all())  # 3 mantissa bits, scale at most 2x amax / 448
    assert bool(torch.isfinite(back).all())


def test_fp4_round_tripped_keys_are_stored_exactly(gen):
    keys = fp4_roundtrip(hadamard_rotate(torch.randn(40, 16, generator=gen)), 8)
    back = fp8_index_key_dequantize_ref(fp8_index_key_quantize_ref(keys, layout=TINY), layout=TINY)
    assert_same_bits(back, keys)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", [DSV4_INDEX_LAYOUT, TINY], ids=["dsv4", "tiny"])
def test_triton_codec_equals_the_reference_bit_for_bit(dtype, layout, gen):
    x = (torch.randn(70, layout.dim, generator=gen) * torch.logspace(-9, 6, 70)[:, None]).to(dtype)
    x[0] = 0.0
    got = fp8_index_key_quantize(x, layout=layout)
    assert_same_bits(got, fp8_index_key_quantize_ref(x, layout=layout))
    assert_same_bits(fp8_index_key_dequantize(got, layout=layout), fp8_index_key_dequantize_ref(got, layout=layout))


@pytest.mark.parametrize("quant", [fp8_index_key_quantize, fp8_index_key_quantize_ref], ids=["triton", "torch"])
def test_quantize_writes_into_a_strided_row_view_and_leaves_the_neighbours(quant, gen):
    assert_encodes_into_strided_rows(quant, fp8_index_key_quantize_ref, torch.randn(4, 16, generator=gen), 20, 24,
                                     layout=TINY)


@pytest.mark.parametrize("quant", [fp8_index_key_quantize, fp8_index_key_quantize_ref], ids=["triton", "torch"])
def test_codec_rejects_bad_arguments(quant):
    assert_encode_refuses_bad_rows(quant, 128, 132)
    with pytest.raises(ValueError, match="multiple of 4"):
        quant(torch.zeros(2, 6), layout=Fp8IndexKeyLayout(dim=6))


@pytest.mark.parametrize("dequant", [fp8_index_key_dequantize, fp8_index_key_dequantize_ref], ids=["triton", "torch"])
def test_dequantize_rejects_a_row_of_the_wrong_width(dequant):
    with pytest.raises(ValueError, match="width"):
        dequant(torch.zeros(2, 128, dtype=torch.uint8))
