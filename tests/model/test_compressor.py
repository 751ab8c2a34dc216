"""Compressor invariants (dsv4_model.md 2.3, section 6 items 4, 6, 7): overlap dependencies, pooling formula,
RoPE at the block's first position, block-0 padding, and the state ring layout."""

from __future__ import annotations

import math

import pytest
import torch

from atom.models.deepseek_v4.cache import CompressorState
from atom.models.deepseek_v4.layers import map_rows
from atom.models.deepseek_v4.rope import layer_frequencies


def fresh_state(comp) -> CompressorState:
    width = (2 if comp.overlap else 1) * comp.head_dim
    return CompressorState(torch.zeros(comp.ring_size, width), torch.full((comp.ring_size, width), -math.inf))


@torch.no_grad()
def compress(comp, x: torch.Tensor, chunk: int | None = None) -> torch.Tensor:
    state, n = fresh_state(comp), x.shape[0]
    entries = torch.full((n // comp.ratio, comp.head_dim), float("nan"))
    chunk = chunk or n
    for s in range(0, n, chunk):
        comp.extend(x[s : s + chunk], torch.arange(s, min(n, s + chunk)), state, entries)
    return entries


def rotate_reference(v: torch.Tensor, pos: int, freqs: torch.Tensor) -> torch.Tensor:
    """Independent RoPE: the tail as complex pairs times exp(i * pos * freq), in float64."""
    rd = 2 * freqs.shape[0]
    tail = v[-rd:].double().reshape(-1, 2)
    z = torch.complex(tail[:, 0], tail[:, 1]) * torch.polar(torch.ones_like(freqs.double()), pos * freqs.double())
    return torch.cat((v[:-rd].double(), torch.view_as_real(z).flatten()))


@pytest.mark.parametrize("layer", [1, 2])  # CSA, HCA(16)
@torch.no_grad()
def test_each_entry_depends_exactly_on_its_tokens(bi_model, layer):
    comp = bi_model.layers[layer].attn.compressor
    m = comp.ratio
    n = 6 * 4 if m == 4 else 3 * 16
    x = torch.randn(n, 64, generator=torch.Generator().manual_seed(3))
    base = compress(comp, x)
    for j in range(n):
        x2 = x.clone()
        x2[j] += 0.5
        out = compress(comp, x2)
        changed = [i for i in range(n // m) if not torch.equal(out[i], base[i])]
        lo = (lambda i: 4 * i - 4) if m == 4 else (lambda i: m * i)
        assert changed == [i for i in range(n // m) if lo(i) <= j <= m * i + m - 1], f"token {j}"


@pytest.mark.parametrize("layer", [1, 2, 3])
@torch.no_grad()
def test_entries_follow_the_gated_pooling_formula_with_rope_at_the_block_start(bi_model, layer):
    comp = bi_model.layers[layer].attn.compressor
    m, c = comp.ratio, comp.head_dim
    n = 12 if m == 4 else 32
    x = torch.randn(n, 64, generator=torch.Generator().manual_seed(4))
    got = compress(comp, x)
    pos = torch.arange(n)
    kv = x.double() @ comp.wkv.weight.double().T
    score = x.double() @ comp.wgate.weight.double().T + comp.ape.double()[pos % m]
    freqs = layer_frequencies(bi_model.cfg, m)
    for i in range(n // m):
        if m == 4:
            lo = max(0, 4 * i - 4)
            k = torch.cat((kv[lo : 4 * i, :c], kv[4 * i : 4 * i + 4, c:]))
            s = torch.cat((score[lo : 4 * i, :c], score[4 * i : 4 * i + 4, c:]))
        else:
            k, s = kv[m * i : m * i + m], score[m * i : m * i + m]
        w = torch.exp(s - s.max(0).values) / torch.exp(s - s.max(0).values).sum(0)
        pooled = (w * k).sum(0)
        normed = pooled / torch.sqrt(pooled.square().mean() + 1e-6) * comp.norm.weight.double()
        torch.testing.assert_close(got[i].double(), rotate_reference(normed, i * m, freqs), rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_first_csa_entry_pads_the_missing_previous_block_and_ignores_stale_ring_rows(bi_model):
    comp = bi_model.layers[1].attn.compressor
    x = torch.randn(4, 64, generator=torch.Generator().manual_seed(5))
    clean = compress(comp, x)
    state = fresh_state(comp)
    state.kv.fill_(float("nan"))
    state.score.fill_(float("nan"))
    entries = torch.zeros(1, comp.head_dim)
    comp.extend(x, torch.arange(4), state, entries)
    assert torch.isfinite(clean).all()
    assert torch.equal(entries, clean)


@torch.no_grad()
def test_state_ring_rows_are_indexed_by_position_and_hold_score_plus_ape(bi_model):
    comp = bi_model.layers[1].attn.compressor
    x = torch.randn(11, 64, generator=torch.Generator().manual_seed(6))
    state = fresh_state(comp)
    comp.extend(x, torch.arange(11), state, torch.zeros(2, comp.head_dim))
    kv = x @ comp.wkv.weight.T
    score = x @ comp.wgate.weight.T
    for p in range(3, 11):  # the ring keeps the last 8 positions
        torch.testing.assert_close(state.kv[p % 8], kv[p])
        torch.testing.assert_close(state.score[p % 8], score[p] + comp.ape[p % 4])
    assert state.kv.shape == (8, 2 * comp.head_dim)
    assert bi_model.layers[2].attn.compressor.ring_size == 16


@pytest.mark.parametrize("chunk", [1, 3, 5])
@torch.no_grad()
def test_given_the_same_projected_rows_chunked_pooling_is_bit_identical(bi_model, chunk):
    for layer in (1, 2):
        comp = bi_model.layers[layer].attn.compressor
        x = torch.randn(32, 64, generator=torch.Generator().manual_seed(7))
        kv, score = map_rows(comp.project, True, x, torch.arange(32))
        whole = torch.full((32 // comp.ratio, comp.head_dim), float("nan"))
        comp.extend_rows(kv, score, torch.arange(32), fresh_state(comp), whole)
        chunked = torch.full_like(whole, float("nan"))
        state = fresh_state(comp)
        for s in range(0, 32, chunk):
            pos = torch.arange(s, min(32, s + chunk))
            comp.extend_rows(kv[pos], score[pos], pos, state, chunked)
        assert torch.isfinite(whole).all()
        assert torch.equal(chunked, whole)


@torch.no_grad()
def test_chunked_compression_matches_within_fp32_tolerance_with_batched_projections(bi_model):
    comp = bi_model.layers[1].attn.compressor
    x = torch.randn(32, 64, generator=torch.Generator().manual_seed(8))
    torch.testing.assert_close(compress(comp, x, 3), compress(comp, x), rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_layer_rope_tables_use_plain_theta_for_window_layers_and_yarn_for_compressed_ones(bi_model):
    cfg = bi_model.cfg
    k = torch.arange(0, cfg.rope_head_dim, 2, dtype=torch.float32) / cfg.rope_head_dim
    plain = layer_frequencies(cfg, 0)
    torch.testing.assert_close(plain, 1.0 / (10000.0**k), rtol=0, atol=0)
    yarn = layer_frequencies(cfg, 4)
    base = 1.0 / (160000.0**k)
    torch.testing.assert_close(yarn[0], base[0], rtol=0, atol=0)  # high-frequency pair: not interpolated
    assert base[-1] / 16 < yarn[-1] < base[-1]                   # low-frequency pair: interpolated
    assert torch.equal(bi_model.layers[0].attn.freqs, plain)
    assert torch.equal(bi_model.layers[2].attn.freqs, yarn)
    assert torch.equal(bi_model.mtp[0].attn.freqs, plain)


@pytest.mark.parametrize("layer", [2, 4])  # the HCA layers (ratio 16)
@torch.no_grad()
def test_the_online_hca_accumulator_gives_the_reference_entries_within_1e_6_relative(bi_model, layer):
    from atom.kernels.hca_state import hca_state_update_ref

    comp = bi_model.layers[layer].attn.compressor
    m, n = comp.ratio, 5 * comp.ratio
    x = torch.randn(n, 64, generator=torch.Generator().manual_seed(7)) * 4
    want = compress(comp, x)
    kv, score = comp.project(x, torch.arange(n))
    acc, pooled = torch.full((1, 3, comp.head_dim), float("nan")), torch.full((n, comp.head_dim), float("nan"))
    i32 = lambda v: torch.tensor(v, dtype=torch.int32)  # noqa: E731
    hca_state_update_ref(kv, score, torch.zeros_like(comp.ape), acc, i32([0]), i32([0, n]), i32([0]), pooled)
    got = torch.stack([comp.finish(pooled[m * i + m - 1], i) for i in range(n // m)])
    rel = (got - want).abs().amax(dim=1) / want.abs().amax(dim=1)
    assert float(rel.max()) < 1e-6
