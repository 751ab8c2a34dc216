"""The cache invariants on the other tiny variants of dsv4_model.md section 6: Pro-like ratios (HCA first), a
window equal to the HCA ratio, no MTP, and a ratio-128 "fidelity" model over more than 256 tokens."""

from __future__ import annotations

import pytest
import torch
from dsv4_testlib import build, run_chunks, tokens

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


def test_ratio_128_model_compresses_whole_blocks_and_chunks_exactly():
    cfg = DeepseekV4Config.tiny(batch_invariant=True, compress_ratios=(0, 4, 128, 4, 128, 4, 0), window_size=16)
    model = build(cfg, seed=3)
    toks = tokens(260, seed=6)
    full, cache = run_chunks(model, toks, [260], cache=model.new_cache(300))
    chunked, _ = run_chunks(model, toks, [127, 2, 131], cache=model.new_cache(300, poison=float("nan")))
    assert torch.equal(chunked, full)
    assert cache.layers[2].entries.shape == (2, cfg.head_dim)
    assert torch.isfinite(cache.layers[2].entries).all()
