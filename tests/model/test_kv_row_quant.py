"""The reference model's KV-row round-trip under ``quant_sim`` is exactly what the arena's fp8_ds_mla codec stores and
reads back: same FP8 block, same power-of-two scales (amax floor 1e-4, ceiling from the fp32 bits), RoPE dims bf16."""

import pytest
import torch

from atom.kernels.fp8_ds_mla import DSV4_LAYOUT, Fp8DsMlaLayout, fp8_ds_mla_dequantize_ref, fp8_ds_mla_quantize_ref
from atom.models.deepseek_v4 import DeepseekV4Config
from atom.models.deepseek_v4.quant import fp8_roundtrip, kv_row_roundtrip


def hard_rows(n, nope, dim, gen):
    x = torch.randn(n, dim, generator=gen) * torch.logspace(-8, 6, n)[:, None]
    x[0] = 0.0  # all-zero blocks: the amax floor sets the scale
    x[1, :nope] = 3e-9  # below the floor: fp8 subnormals
    x[2, 3] = 1e30  # one huge outlier
    w = min(nope, 64)
    x[3, :w] = 448.0 * 2.0 ** torch.arange(-w // 2, w - w // 2).float()  # exact powers of two
    x[4, :nope] = 448.0 * (1 + 2.0 ** -20)  # just above a power of two: the ceiling must round up
    return x


@pytest.mark.parametrize("layout", [Fp8DsMlaLayout(nope=24, rope=8, qblock=8), DSV4_LAYOUT], ids=["tiny", "dsv4"])
def test_the_kv_row_round_trip_equals_the_fp8_ds_mla_codec_bit_for_bit(layout):
    x = hard_rows(12, layout.nope, layout.dim, torch.Generator().manual_seed(3))
    codec = fp8_ds_mla_dequantize_ref(fp8_ds_mla_quantize_ref(x, layout=layout), out_dtype=torch.float32,
                                      layout=layout)
    model = kv_row_roundtrip(x, layout.nope, layout.qblock)
    assert torch.equal(model.view(torch.int32), codec.view(torch.int32))


def test_the_tiny_models_fp8_block_is_the_one_its_arena_rows_use():
    cfg = DeepseekV4Config.tiny()
    assert (cfg.nope_dim, cfg.fp8_block) == (24, 8)
    from atom.model_ops.kv_views import row_codecs

    main, index = row_codecs(cfg.kv_spec("fp8_ds_mla", include_mtp=False))
    assert (main.nope, main.rope, main.qblock) == (24, 8, 8) and index.dim == 16


def test_rope_dims_are_rounded_to_bf16_and_nope_dims_to_fp8():
    x = torch.zeros(1, 32)
    x[0, 0] = 3.0  # block 0 (dims 0-7): amax 3 -> scale 2**-7 -> 384 in fp8, exact
    x[0, 9] = 100.0 / 3.0  # block 1: amax 33.3 -> scale 2**-3 -> 266.67 rounds to 256 in e4m3 -> 32.0
    x[0, 24] = 1.0 + 2.0 ** -10  # RoPE dim: not a bf16 value, rounds to 1.0
    y = kv_row_roundtrip(x, 24, 8)
    assert y[0, 0].item() == 3.0 and y[0, 9].item() == 32.0 and y[0, 24].item() == 1.0
    assert torch.equal(y[:, :24], fp8_roundtrip(x[:, :24], 8))


def test_an_all_zero_or_tiny_block_takes_its_scale_from_the_amax_floor():
    x = torch.zeros(1, 8)
    x[0, 0] = 1e-6  # 1e-6 / 2**-22 = 4.19 -> e4m3 4.0 -> 4 * 2**-22
    assert fp8_roundtrip(x, 8)[0, 0].item() == 4.0 * 2.0 ** -22
