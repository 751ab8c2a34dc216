"""Simulated quantization (section 6 item 11) and the MTP block (item 12)."""

from __future__ import annotations

import pytest
import torch
from support.dsv4 import SEQ, build, run_chunks, tokens

from atom.models.deepseek_v4 import DeepseekV4Config
from atom.models.deepseek_v4.attention import attend
from atom.models.deepseek_v4.quant import fp4_roundtrip, fp8_roundtrip, hadamard_matrix


@pytest.fixture(scope="module")
def quant_model():
    return build(DeepseekV4Config.tiny(quant_sim=True, batch_invariant=True))


def test_fp8_round_trip_is_idempotent_with_power_of_two_block_scales():
    x = torch.randn(3, 24, generator=torch.Generator().manual_seed(0)) * 5
    y = fp8_roundtrip(x, 8)
    assert torch.equal(fp8_roundtrip(y, 8), y)
    assert not torch.equal(y, x)
    assert ((y - x).abs() <= x.abs() / 8 + 1e-6).all()
    blocks = x.reshape(3, 3, 8).abs().amax(-1)
    scale = torch.exp2(torch.ceil(torch.log2(blocks / 448)))
    assert torch.equal(fp8_roundtrip(x, 8), ((x.reshape(3, 3, 8) / scale[..., None]).to(torch.float8_e4m3fn)
                                             .float() * scale[..., None]).reshape(3, 24))


def test_fp4_round_trip_lands_on_the_e2m1_grid_times_a_power_of_two():
    x = torch.randn(2, 16, generator=torch.Generator().manual_seed(1))
    y = fp4_roundtrip(x, 8)
    assert torch.equal(fp4_roundtrip(y, 8), y)
    scale = torch.exp2(torch.ceil(torch.log2(x.reshape(2, 2, 8).abs().amax(-1) / 6)))
    grid = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    q = (y.reshape(2, 2, 8) / scale[..., None]).abs()
    assert torch.isin(q, grid).all()


def test_hadamard_matrix_is_orthogonal():
    h = hadamard_matrix(16)
    torch.testing.assert_close(h @ h.T, torch.eye(16), rtol=0, atol=1e-6)


@torch.no_grad()
def test_with_quant_sim_cached_rows_equal_the_rows_used_by_attention_in_the_same_step(quant_model, monkeypatch):
    cfg = quant_model.cfg
    attn = quant_model.layers[1].attn
    seen = []
    monkeypatch.setattr(attn, "attend", lambda q, rows: (seen.append(rows.clone()), attend(
        q, rows, attn.attn_sink, attn.scale))[1])
    cache = quant_model.new_cache(64)
    for t in range(13):
        quant_model.extend(cache, tokens(13)[t : t + 1], t)
        lc = cache.layers[1]
        w = min(t + 1, cfg.window_size)
        assert torch.equal(seen[-1][w - 1], lc.swa[t % cfg.window_size])  # own row, as cached
        n = (t + 1) // 4
        picked = seen[-1][w:]
        assert picked.shape[0] == min(3, n)
        assert all(any(torch.equal(r, e) for e in lc.entries[:n]) for r in picked)
    nope = cfg.nope_dim
    lc = cache.layers[1]
    assert torch.equal(fp8_roundtrip(lc.swa[:, :nope], 8), lc.swa[:, :nope])
    assert torch.equal(fp8_roundtrip(lc.entries[:3, :nope], 8), lc.entries[:3, :nope])
    assert torch.equal(fp4_roundtrip(lc.index_keys[:3], 8), lc.index_keys[:3])


def test_quant_sim_keeps_prefill_then_decode_bit_exact_and_changes_the_logits(quant_model, bi_model):
    toks = tokens()
    full, _ = run_chunks(quant_model, toks, [SEQ])
    step, _ = run_chunks(quant_model, toks, [1])
    assert torch.equal(step, full)
    plain, _ = run_chunks(bi_model, toks, [SEQ])
    assert not torch.equal(full, plain)
    assert torch.isfinite(full).all()


def test_mtp_layer_has_only_a_window_sized_swa_cache(bi_model):
    lc = bi_model.new_cache(64).layers[-1]
    assert lc.ratio == 0
    assert lc.entries is None and lc.state is None and lc.index_keys is None and lc.index_state is None
    assert tuple(lc.swa.shape) == (bi_model.cfg.window_size, bi_model.cfg.head_dim)
    assert bi_model.mtp[0].attn.compressor is None and bi_model.mtp[0].attn.indexer is None


def test_mtp_step_by_step_equals_one_mtp_pass_and_survives_snapshot_restore(bi_model):
    toks = tokens()
    cache = bi_model.new_cache(64)
    out = bi_model.prefill(cache, toks)
    whole = bi_model.mtp_extend(cache, out.hidden[:-1], toks[1:], 0)

    stepped, ref = [], bi_model.new_cache(64)
    for t in range(SEQ - 1):
        o = bi_model.extend(ref, toks[t : t + 1], t)
        if t >= 1:
            stepped.append(bi_model.mtp_extend(ref, hidden_prev, toks[t : t + 1], t - 1))
        if t == 20:
            snap = bi_model.snapshot(ref)
        hidden_prev = o.hidden
    assert torch.equal(torch.cat(stepped), whole[: SEQ - 2])

    restored = bi_model.new_cache(64, poison=float("nan"))
    bi_model.restore(snap, restored)  # main at 21 tokens, MTP at 20
    assert (restored.num_tokens, restored.mtp_tokens) == (21, 20)
    o = bi_model.extend(restored, toks[21:], 21)
    cont = bi_model.mtp_extend(restored, torch.cat((out.hidden[20:21], o.hidden[:-1])), toks[21:], 20)
    assert torch.equal(cont, whole[20:])


@torch.no_grad()
def test_mtp_uses_the_shared_embedding_and_lm_head(bi_model):
    names = set(bi_model.state_dict())
    assert not any(n.startswith("mtp.0.") and ("emb" in n.split(".")[2] or n.endswith("head.weight"))
                   for n in names)
    toks = tokens(6)
    cache = bi_model.new_cache(16)
    hidden = bi_model.prefill(cache, toks).hidden
    logits = bi_model.mtp_extend(cache, hidden[:-1], toks[1:], 0)
    y, _ = bi_model.mtp[0].mtp_forward(hidden[:-1], bi_model.embed.weight[toks[1:]], toks[1:],
                                       bi_model.new_cache(16).layers[-1], 0)
    torch.testing.assert_close(logits, y @ bi_model.head.weight.T, rtol=1e-5, atol=1e-5)
