"""KV memory accounting reproduces the published DeepSeek-V4 figures."""

import pytest

from atom.config import Dsv4KvSpec
from atom.bench.kv_accounting import compressed_bytes_per_token, mla_kv_bytes, request_kv_bytes
from atom.models.deepseek_v4.config import DeepseekV4Config

GIB = 1 << 30
MILLION = 1 << 20


def spec(name, fmt, include_mtp=False):
    return DeepseekV4Config.from_preset(name).kv_spec(fmt, include_mtp=include_mtp)


def test_v4_pro_bf16_holds_9_62_gib_for_a_million_tokens():
    pro = spec("deepseek_v4_pro", "bf16")
    assert compressed_bytes_per_token(pro) == 9848
    assert round(request_kv_bytes(pro, MILLION) / GIB, 2) == 9.62


@pytest.mark.parametrize("name,fmt,per_token", [("deepseek_v4_pro", "fp8_ds_mla", 5511), ("deepseek_v4_flash", "bf16", 6880),
                                                ("deepseek_v4_flash", "fp8_ds_mla", 3850)])
def test_bytes_per_token_match_the_published_table(name, fmt, per_token):
    assert int(compressed_bytes_per_token(spec(name, fmt))) == per_token


def test_a_v3_2_style_mla_stack_needs_83_9_gib():
    assert round(mla_kv_bytes(61, 576 + 128, 2, MILLION) / GIB, 1) == 83.9


def test_compressor_state_is_a_64_and_16_kib_csa_ring_and_a_6_kib_hca_accumulator_per_layer():
    flash = spec("deepseek_v4_flash", "fp8_ds_mla")
    csa, hca = flash.csa_layers[0], flash.hca_layers[0]
    main = 2 * 8 * 1024 * 4
    index = 2 * 8 * 256 * 4
    assert (main, index) == (64 * 1024, 16 * 1024)
    assert flash.compressor_state_bytes(csa) == main + index
    assert flash.compressor_state_bytes(hca) == 3 * 512 * 4  # running max, sum and weighted sum, fp32
    assert flash.compressor_state_bytes(0) == 0
    assert flash.request_state_bytes == 21 * 80 * 1024 + 20 * 6 * 1024


def test_a_request_shorter_than_a_ratio_holds_only_window_rows():
    flash = spec("deepseek_v4_flash", "fp8_ds_mla")
    assert request_kv_bytes(flash, 3) == 3 * 584 * 43
    assert request_kv_bytes(flash, 3, include_window=False) == 0


def test_negative_token_counts_are_rejected():
    with pytest.raises(ValueError, match="num_tokens"):
        request_kv_bytes(spec("deepseek_v4_flash", "bf16"), -1)
