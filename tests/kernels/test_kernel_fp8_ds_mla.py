"""fp8_ds_mla row codec: reference vs a per-value loop, Triton vs reference bit-exact (through uint8)."""

import math

import pytest
import torch
from support.kernels import assert_same_bits
from support.row_codecs import assert_encode_refuses_bad_rows, assert_encodes_into_strided_rows

from atom.kernels.fp8_ds_mla import (DSV4_LAYOUT, Fp8DsMlaLayout, fp8_ds_mla_dequantize, fp8_ds_mla_dequantize_ref,
                                     fp8_ds_mla_quantize, fp8_ds_mla_quantize_ref)

TINY = Fp8DsMlaLayout(nope=16, rope=8, qblock=8)  # 16 + 16 + 2 -> 34, padded to 40 bytes


def hard_rows(n, dim, gen):
    x = torch.randn(n, dim, generator=gen) * torch.logspace(-7, 5, n)[:, None]
    x[0] = 0.0  # all-zero row: scale floor
    w = min(dim, 64)
    x[1, :w] = 3e-9  # tiny block -> fp8 subnormals
    x[2, 5] = 1e30  # one huge outlier
    x[3, :w] = 448.0 * 2.0 ** torch.arange(-32, w - 32).float()  # exact powers of two
    return x


def test_the_real_row_is_584_bytes():
    assert DSV4_LAYOUT.row_bytes == 584 and DSV4_LAYOUT.scale_off == 576 and DSV4_LAYOUT.n_scales == 7
    assert TINY.row_bytes == 40


def test_reference_encodes_a_hand_computed_row():
    x = torch.zeros(1, TINY.dim)
    x[0, 0], x[0, 1] = 3.0, -1.5  # block 0: amax 3 -> e = ceil(log2(3/448)) = -7, values * 128
    x[0, 8] = 448.0  # block 1: amax 448 -> e = 0
    x[0, 16] = 1.0  # rope dim 0: bf16 0x3F80
    row = fp8_ds_mla_quantize_ref(x, layout=TINY)[0]
    assert row[0].item() == torch.tensor(384.0).to(torch.float8_e4m3fn).view(torch.uint8).item()
    assert row[1].item() == torch.tensor(-192.0).to(torch.float8_e4m3fn).view(torch.uint8).item()
    assert row[8].item() == 0x7E  # 448 = max finite e4m3fn
    assert row[16].item() == 0x80 and row[17].item() == 0x3F
    assert row[32].item() == 127 - 7 and row[33].item() == 127
    assert row[34:].tolist() == [0] * 6


def test_reference_equals_a_per_block_loop(gen):
    x = hard_rows(8, DSV4_LAYOUT.dim, gen)
    got = fp8_ds_mla_quantize_ref(x)
    for r in range(x.shape[0]):
        for b in range(7):
            blk = x[r, 64 * b:64 * (b + 1)]
            amax = torch.clamp(blk.abs().max(), min=1e-4)
            mant, exp = math.frexp((amax / 448.0).item())  # the fp32 quotient, exactly, as m * 2**exp
            e = exp if mant > 0.5 else exp - 1  # ceil(log2(quotient))
            assert got[r, 576 + b].item() == e + 127
            want = (blk / 2.0 ** e).to(torch.float8_e4m3fn).view(torch.uint8)
            assert_same_bits(got[r, 64 * b:64 * (b + 1)], want)
        assert_same_bits(got[r, 448:576].view(torch.bfloat16), x[r, 448:].to(torch.bfloat16))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("layout", [DSV4_LAYOUT, TINY], ids=["dsv4", "tiny"])
def test_triton_codec_equals_the_reference_bit_for_bit(dtype, layout, gen):
    x = hard_rows(70, layout.dim, gen).to(dtype)
    got = fp8_ds_mla_quantize(x, layout=layout)
    ref = fp8_ds_mla_quantize_ref(x, layout=layout)
    assert_same_bits(got, ref)
    for out_dtype in (torch.float32, torch.bfloat16):
        assert_same_bits(fp8_ds_mla_dequantize(got, out_dtype=out_dtype, layout=layout),
                         fp8_ds_mla_dequantize_ref(ref, out_dtype=out_dtype, layout=layout))


@pytest.mark.parametrize("quant", [fp8_ds_mla_quantize, fp8_ds_mla_quantize_ref], ids=["triton", "torch"])
def test_quantize_writes_into_a_strided_arena_row_view_and_leaves_the_neighbours(quant, gen):
    assert_encodes_into_strided_rows(quant, fp8_ds_mla_quantize_ref, torch.randn(5, 512, generator=gen), 584, 600)


def test_round_trip_error_is_within_half_an_fp8_step(gen):
    x = torch.randn(16, 512, generator=gen) * 3
    back = fp8_ds_mla_dequantize_ref(fp8_ds_mla_quantize_ref(x), out_dtype=torch.float32)
    amax = x[:, :448].abs().view(16, 7, 64).amax(-1, keepdim=True)
    err = (back[:, :448] - x[:, :448]).abs().view(16, 7, 64)
    assert bool((err <= amax * 2.0 ** -3).all())  # 3 mantissa bits: relative step 1/8 of the block scale
    assert_same_bits(back[:, 448:], x[:, 448:].to(torch.bfloat16).float())


@pytest.mark.parametrize("quant", [fp8_ds_mla_quantize, fp8_ds_mla_quantize_ref], ids=["triton", "torch"])
def test_codec_rejects_bad_arguments(quant):
    assert_encode_refuses_bad_rows(quant, 512, 584)
    with pytest.raises(ValueError, match="qblock"):
        quant(torch.zeros(2, 24), layout=Fp8DsMlaLayout(nope=12, rope=12, qblock=8))


@pytest.mark.parametrize("dequant", [fp8_ds_mla_dequantize, fp8_ds_mla_dequantize_ref], ids=["triton", "torch"])
def test_dequantize_rejects_bad_arguments(dequant):
    with pytest.raises(ValueError, match="width"):
        dequant(torch.zeros(2, 580, dtype=torch.uint8))
    with pytest.raises(ValueError, match="out_dtype"):
        dequant(torch.zeros(2, 584, dtype=torch.uint8), out_dtype=torch.float16)
