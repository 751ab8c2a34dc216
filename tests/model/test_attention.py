"""Attention invariants (dsv4_model.md 2.1-2.6, section 6 items 5, 7, 8, 9): sink, RoPE positions, inverse RoPE
on the output, grouped output projection, the rows each query attends to, and lightning-indexer top-k."""

from __future__ import annotations

import math

import pytest
import torch
from support.dsv4 import SEQ, tokens

from atom.models.deepseek_v4.attention import attend
from atom.models.deepseek_v4.indexer import Indexer
from atom.models.deepseek_v4.rope import apply_rope, rope_frequencies


def test_attention_with_sink_minus_infinity_is_plain_softmax_attention():
    g = torch.Generator().manual_seed(0)
    q, rows = torch.randn(4, 32, generator=g), torch.randn(11, 32, generator=g)
    out = attend(q, rows, torch.full((4,), -math.inf), 32**-0.5)
    expect = torch.softmax(q.double() @ rows.double().T * 32**-0.5, dim=-1) @ rows.double()
    torch.testing.assert_close(out.double(), expect, rtol=1e-6, atol=1e-6)


def test_a_finite_sink_only_adds_to_the_denominator_so_row_mass_is_below_one():
    g = torch.Generator().manual_seed(1)
    q, row = torch.randn(4, 32, generator=g), torch.randn(1, 32, generator=g)
    rows = row.repeat(5, 1)  # identical rows: output = mass * row
    sink = torch.tensor([-1.0, 0.0, 2.0, 5.0])
    out = attend(q, rows, sink, 32**-0.5)
    s = (q.double() @ row.double().T).squeeze(1) * 32**-0.5
    mass = 5 * torch.exp(s) / (5 * torch.exp(s) + torch.exp(sink.double()))
    torch.testing.assert_close(out.double(), mass[:, None] * row.double(), rtol=1e-6, atol=1e-6)
    assert (mass < 1).all()


def test_rope_rotates_interleaved_pairs_of_the_tail_dims_only():
    freqs = rope_frequencies(8, 10000.0)
    x = torch.randn(3, 2, 32, generator=torch.Generator().manual_seed(2))
    pos = torch.tensor([0, 5, 1000])
    y = apply_rope(x, pos, freqs)
    assert torch.equal(y[..., :24], x[..., :24])
    assert torch.equal(y[0], x[0])
    for t in range(3):
        for h in range(2):
            pairs = x[t, h, 24:].double().reshape(4, 2)
            z = torch.complex(pairs[:, 0], pairs[:, 1]) * torch.polar(torch.ones(4, dtype=torch.float64),
                                                                    pos[t] * freqs.double())
            torch.testing.assert_close(y[t, h, 24:].double(), torch.view_as_real(z).flatten(), rtol=1e-5,
                                       atol=1e-5)
    torch.testing.assert_close(apply_rope(y, pos, freqs, inverse=True), x, rtol=1e-5, atol=1e-5)


def test_query_key_scores_depend_only_on_relative_position():
    freqs = rope_frequencies(8, 10000.0)
    g = torch.Generator().manual_seed(3)
    q, k = torch.randn(1, 32, generator=g), torch.randn(1, 32, generator=g)
    a = apply_rope(q, torch.tensor([7]), freqs) @ apply_rope(k, torch.tensor([3]), freqs).T
    b = apply_rope(q, torch.tensor([104]), freqs) @ apply_rope(k, torch.tensor([100]), freqs).T
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


@torch.no_grad()
@pytest.mark.parametrize("layer", [0, 1, 2])
def test_kv_rows_are_rotated_at_their_own_position(bi_model, layer):
    attn = bi_model.layers[layer].attn
    x = torch.randn(1, 64, generator=torch.Generator().manual_seed(4)).repeat(3, 1)
    kv = attn.project_kv(x, torch.tensor([0, 9, 33]))
    for t, p in enumerate((0, 9, 33)):
        torch.testing.assert_close(kv[t], apply_rope(kv[0:1], torch.tensor([p]), attn.freqs)[0])
    assert not torch.equal(kv[1], kv[0])


@torch.no_grad()
def test_output_projection_undoes_the_query_position_rotation(bi_model):
    attn = bi_model.layers[1].attn
    v = torch.randn(1, 4, 32, generator=torch.Generator().manual_seed(5))
    at_zero = attn.project_out(v, torch.tensor([0]))
    at_t = attn.project_out(apply_rope(v, torch.tensor([21]), attn.freqs), torch.tensor([21]))
    torch.testing.assert_close(at_t, at_zero, rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_output_projection_applies_wo_a_per_group_then_wo_b(bi_model):
    attn, cfg = bi_model.layers[0].attn, bi_model.cfg
    o = torch.randn(2, 4, 32, generator=torch.Generator().manual_seed(6))
    got = attn.project_out(o, torch.tensor([0, 0]))
    flat = o.double().reshape(2, -1)
    per = flat.shape[1] // cfg.o_groups
    wo_a = attn.wo_a.weight.double()
    z = torch.cat([flat[:, g * per : (g + 1) * per] @ wo_a[g * 16 : (g + 1) * 16].T for g in range(cfg.o_groups)], 1)
    torch.testing.assert_close(got.double(), z @ attn.wo_b.weight.double().T, rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_queries_are_rms_normalised_per_head_before_rope(bi_model):
    attn = bi_model.layers[0].attn
    q, _ = attn.project_q(torch.randn(3, 64, generator=torch.Generator().manual_seed(7)), torch.arange(3))
    torch.testing.assert_close(q.square().mean(-1), torch.ones(3, 4), rtol=1e-4, atol=1e-4)


@torch.no_grad()
def test_each_query_attends_its_window_then_its_visible_compressed_entries(bi_model, monkeypatch):
    cfg, W = bi_model.cfg, bi_model.cfg.window_size
    seen: dict[int, list[torch.Tensor]] = {0: [], 1: [], 2: []}
    for k in seen:
        attn = bi_model.layers[k].attn
        monkeypatch.setattr(attn, "attend", lambda q, rows, k=k, a=attn: (seen[k].append(rows), attend(
            q, rows, a.attn_sink, a.scale))[1])
    cache = bi_model.new_cache(64)
    bi_model.prefill(cache, tokens())
    for t in range(SEQ):
        assert seen[0][t].shape[0] == min(t + 1, W)                                       # SWA only
        assert seen[1][t].shape[0] == min(t + 1, W) + min(cfg.index_topk, (t + 1) // 4)   # CSA: top-k
        assert seen[2][t].shape[0] == min(t + 1, W) + (t + 1) // 16                       # HCA: all entries
    last = [cache.layers[2].swa[p % W] for p in range(SEQ - W, SEQ)]
    assert torch.equal(seen[2][-1][:W], torch.stack(last))
    assert torch.equal(seen[2][-1][W:], cache.layers[2].entries[: SEQ // 16])


def test_top_k_selects_every_candidate_when_there_are_at_most_k():
    assert Indexer.select(torch.tensor([0.3, -1.0, 2.0]), 3).tolist() == [0, 1, 2]
    assert Indexer.select(torch.tensor([0.5]), 3).tolist() == [0]
    assert Indexer.select(torch.zeros(0), 3).tolist() == []


def test_top_k_breaks_ties_by_lower_index_and_returns_indices_ascending():
    scores = torch.tensor([0.0, 2.0, 0.0, 1.0, 2.0, 0.0])
    assert Indexer.select(scores, 3).tolist() == [1, 3, 4]
    assert Indexer.select(scores, 4).tolist() == [0, 1, 3, 4]
    assert Indexer.select(torch.zeros(6), 3).tolist() == [0, 1, 2]


@torch.no_grad()
def test_indexer_score_is_the_weighted_sum_of_relu_head_scores(bi_model):
    idx = bi_model.layers[1].attn.indexer
    g = torch.Generator().manual_seed(8)
    q, w, keys = torch.randn(4, 16, generator=g), torch.randn(4, generator=g), torch.randn(5, 16, generator=g)
    expect = torch.stack([sum(w[h] * max(0.0, float(q[h] @ keys[s])) for h in range(4)) for s in range(5)])
    torch.testing.assert_close(idx.score(q, w, keys), expect.float(), rtol=1e-5, atol=1e-5)
    x = torch.randn(2, 64, generator=g)
    torch.testing.assert_close(idx.head_weights(x), (x @ idx.weights_proj.weight.T) * (16**-0.5 * 4**-0.5))
