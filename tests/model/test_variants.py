"""The cache invariants on the other tiny variants of dsv4_model.md section 6: Pro-like ratios (HCA first), a
window equal to the HCA ratio, no MTP, and a ratio-128 "fidelity" model over more than 256 tokens."""

from __future__ import annotations

import pytest
import torch
from support.dsv4 import build, run_chunks, tokens

from atom.models.deepseek_v4 import DeepseekV4Config

VARIANTS = {
    "pro_like": dict(compress_ratios=(16, 16, 4, 16, 4, 16, 0)),
    "window_16": dict(window_size=16),
    "no_mtp": dict(n_mtp_layers=0, compress_ratios=(0, 4, 16, 4, 16, 4)),
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_variant_chunked_decode_and_restore_equal_one_prefill(name):
    model = build(DeepseekV4Config.tiny(batch_invariant=True, **VARIANTS[name]), seed=2)
    toks = tokens(36, seed=5)
    full, full_cache = run_chunks(model, toks, [36])
    assert torch.equal(run_chunks(model, toks, [5])[0], full)
    assert torch.equal(run_chunks(model, toks, [1])[0], full)
    ref = model.new_cache(64)
    model.extend(ref, toks[:17], 0)
    restored = model.new_cache(64, poison=float("nan"))
    model.restore(model.snapshot(ref), restored)
    assert torch.equal(model.extend(restored, toks[17:], 17).logits, full[17:])


@pytest.mark.slow
def test_ratio_128_model_compresses_whole_blocks_and_chunks_exactly():
    cfg = DeepseekV4Config.tiny(batch_invariant=True, compress_ratios=(0, 4, 128, 4, 128, 4, 0), window_size=16)
    model = build(cfg, seed=3)
    toks = tokens(260, seed=6)
    full, cache = run_chunks(model, toks, [260], cache=model.new_cache(300))
    chunked, _ = run_chunks(model, toks, [127, 2, 131], cache=model.new_cache(300, poison=float("nan")))
    assert torch.equal(chunked, full)
    assert cache.layers[2].entries.shape == (2, cfg.head_dim)
    assert torch.isfinite(cache.layers[2].entries).all()


def test_release_head_geometry_runs_with_release_quant_blocks():
    """head_dim 512 / rope 64 / indexer 128: FP8 blocks of 64 on the 448 NoPE dims, FP4 blocks of 32."""
    cfg = DeepseekV4Config.tiny(batch_invariant=True, quant_sim=True, head_dim=512, rope_head_dim=64,
                                index_head_dim=128, n_heads=2, o_groups=2, o_lora_rank=16)
    assert (cfg.nope_dim, cfg.fp8_block, cfg.fp4_block) == (448, 64, 32)
    model = build(cfg, seed=4)
    toks = tokens(13, seed=7)
    full, cache = run_chunks(model, toks, [13])
    assert torch.equal(run_chunks(model, toks, [1])[0], full)
    assert torch.isfinite(full).all()
    assert cache.layers[1].entries.shape[1] == 512 and cache.layers[1].index_keys.shape[1] == 128
