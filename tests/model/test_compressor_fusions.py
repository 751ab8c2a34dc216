"""The compressor's bind-time fusions: ``wkv`` and ``wgate`` as one GEMM (dense fp32 weights only; other formats keep
two), ``project`` without ``ape`` when the engine's state kernels add it, and ``finish_entries`` at positions the
caller computed once."""

from __future__ import annotations

import pytest
import torch

from atom.models.deepseek_v4 import DeepseekV4Config
from atom.models.deepseek_v4.compressor import Compressor
from atom.models.deepseek_v4.rope import layer_frequencies


def compressor(ratio: int, seed: int = 0, dtype: torch.dtype = torch.float32) -> Compressor:
    """A tiny compressor with seeded random weights (CSA: ratio 4, HCA: any other)."""
    cfg = DeepseekV4Config.tiny()
    comp = Compressor(cfg, ratio, cfg.head_dim, layer_frequencies(cfg, ratio), dtype=dtype)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in comp.parameters():
            p.copy_(torch.randn(p.shape, generator=gen).to(p.dtype))
    return comp


def rows(n: int, dim: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, dim, generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("ratio", [4, 16])
@pytest.mark.parametrize("tokens", [1, 5])
@torch.no_grad()
def test_a_merged_compressor_gives_the_two_gemms_rows_as_views_of_one_product(ratio, tokens):
    comp = compressor(ratio)
    x = rows(tokens, comp.cfg.dim)
    kv_want, score_want = comp.project_raw(x)
    assert comp.bind_fused_gemm(True) is None and comp.kv_gate is not None
    kv, score = comp.project_raw(x)
    width = kv_want.shape[1]
    assert kv.stride(0) == score.stride(0) == 2 * width  # columns of one [T, 2W] product, not copies
    assert score.data_ptr() == kv.data_ptr() + width * kv.element_size()
    # the same fp32 dot products; a GEMM may sum a wider output in another order (last bits only)
    torch.testing.assert_close(kv, kv_want, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(score, score_want, rtol=1e-6, atol=1e-6)


@torch.no_grad()
def test_the_merge_keeps_the_parameter_names_and_a_later_load_writes_through():
    comp = compressor(4)
    names = list(comp.state_dict())
    comp.bind_fused_gemm(True)
    assert list(comp.state_dict()) == names
    other = compressor(4, seed=7)
    comp.load_state_dict(other.state_dict())
    x = rows(3, comp.cfg.dim)
    got, want = comp.project_raw(x), other.project_raw(x)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6)


@torch.no_grad()
def test_fp8_or_bf16_weights_and_an_unfused_bind_keep_two_gemms():
    fp8 = compressor(4)
    fp8.wgate.set_format("fp8")
    assert "dense fp32" in fp8.bind_fused_gemm(True) and fp8.kv_gate is None
    bf16 = compressor(4, dtype=torch.bfloat16)
    assert "dense fp32" in bf16.bind_fused_gemm(True) and bf16.kv_gate is None
    comp = compressor(4)
    comp.bind_fused_gemm(True)
    assert comp.bind_fused_gemm(False) is None and comp.kv_gate is None
    x = rows(2, comp.cfg.dim)
    kv, score = comp.project_raw(x)
    assert kv.is_contiguous() and score.is_contiguous()


@pytest.mark.parametrize("ratio", [4, 16])
@torch.no_grad()
def test_with_the_kernels_adding_ape_project_returns_the_raw_score_and_otherwise_adds_it(ratio):
    comp = compressor(ratio)
    x, positions = rows(6, comp.cfg.dim), torch.tensor([0, 3, 5, 17, 30, 33])
    kv_raw, score_raw = comp.project_raw(x)
    kv, score = comp.project(x, positions)
    assert torch.equal(kv, kv_raw) and torch.equal(score, score_raw + comp.ape[positions % ratio])
    comp.kernels_add_ape = True
    kv, score = comp.project(x, positions)
    assert torch.equal(kv, kv_raw) and torch.equal(score, score_raw)


@pytest.mark.parametrize("ratio", [4, 16])
@torch.no_grad()
def test_finish_entries_at_given_positions_equals_computing_them(ratio):
    comp = compressor(ratio)
    pooled, ids = rows(3, comp.head_dim), torch.tensor([0, 2, 9])
    assert torch.equal(comp.finish_entries(pooled, ids, ids * ratio), comp.finish_entries(pooled, ids))
