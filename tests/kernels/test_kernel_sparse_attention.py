"""Sparse attention with a sink: reference vs a float64 loop, Triton vs reference, and the paged pipeline
(swa_write + compressed_write + index builders + attention) against attention over contiguous K."""

import dataclasses
import math

import pytest
import torch
from support.kernels import arena_rows, assert_within_bf16_probability_rounding, i32, random_table

from atom.kernels.backend import load_kernels
from atom.kernels.key_blocks import fixed_key_blocks
from atom.kernels.sparse_attention import key_splits, sparse_attention, sparse_attention_ref
from atom.kernels.tiles import TILES


def naive_attention(q, wrows, widx, crows, cidx, sink, scale):
    """Per token, per head, in float64: exp(s_j) / (sum exp(s_j) + exp(sink))."""
    T, H, D = q.shape
    out = torch.zeros(T, H, D, dtype=torch.float64)
    for t in range(T):
        keys = [wrows[i].double() for i in widx[t].tolist() if i >= 0]
        if crows is not None:
            keys += [crows[i].double() for i in cidx[t].tolist() if i >= 0]
        for h in range(H):
            num = torch.zeros(D, dtype=torch.float64)
            den = math.exp(float(sink[h]))
            for key in keys:
                e = math.exp(scale * float(q[t, h].double() @ key))
                num += e * key
                den += e
            out[t, h] = num / den
    return out


def random_case(T, H, D, nw, nc, W, Kc, gen, dtype=torch.float32):
    q = torch.randn(T, H, D, generator=gen).to(dtype)
    _, wrows = arena_rows(nw, D, dtype)
    _, crows = arena_rows(nc, D, dtype)
    wrows.copy_(torch.randn(nw, D, generator=gen))
    crows.copy_(torch.randn(nc, D, generator=gen))
    widx = torch.randint(-1, nw, (T, W), generator=gen, dtype=torch.int32)
    cidx = torch.randint(-1, nc, (T, Kc), generator=gen, dtype=torch.int32)
    sink = torch.randn(H, generator=gen)
    return q, wrows, widx, crows, cidx, sink


def test_reference_matches_a_float64_loop(gen):
    q, wrows, widx, crows, cidx, sink = random_case(3, 2, 8, 10, 7, 4, 5, gen)
    widx[0] = -1
    cidx[0] = -1  # a token with nothing to attend: output 0
    got = sparse_attention_ref(q, wrows, widx, crows, cidx, sink, scale=0.3)
    want = naive_attention(q, wrows, widx, crows, cidx, sink, 0.3)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)
    assert bool((got[0] == 0).all()) and float(got[1:].abs().max()) > 0.01


def test_the_sink_only_enlarges_the_denominator():
    rows = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    q = torch.zeros(1, 1, 2)  # equal logits 0 for both rows
    out = sparse_attention_ref(q, rows, i32([[0, 1]]), None, None, torch.tensor([math.log(2.0)]), scale=1.0)
    # weights exp(0) / (1 + 1 + 2) = 1/4 each
    torch.testing.assert_close(out, torch.tensor([[[0.25, 0.25]]]))


@pytest.mark.parametrize("T,W,Kc", [(9, 16, 70), (4, 8, 0)], ids=["prefill-c4-like", "decode-dense"])
def test_triton_equals_the_reference_in_fp32(T, W, Kc, gen):
    q, wrows, widx, crows, cidx, sink = random_case(T, 5, 24, 30, 50, W, Kc, gen)
    widx[1] = -1
    comp = (crows, cidx) if Kc else (None, None)
    got = sparse_attention(q, wrows, widx, *comp, sink, scale=24 ** -0.5)
    ref = sparse_attention_ref(q, wrows, widx, *comp, sink, scale=24 ** -0.5)
    torch.testing.assert_close(got, ref, rtol=2e-5, atol=2e-6)
    assert not bool(got.isnan().any())


@pytest.mark.parametrize("T,H,D,W,Kc", [(5, 4, 32, 8, 20), (3, 20, 48, 5, 37), (1, 64, 16, 16, 0)],
                         ids=["prefill", "heads-past-a-tile-ragged-dims", "one-token-decode-no-comp"])
def test_triton_equals_the_reference_in_bf16_within_the_probability_rounding(T, H, D, W, Kc, gen):
    q, wrows, widx, crows, cidx, sink = random_case(T, H, D, 20, 40, W, Kc, gen, dtype=torch.bfloat16)
    widx[0, : W // 2] = -1
    comp = (crows, cidx) if Kc else (None, None)
    got = sparse_attention(q, wrows, widx, *comp, sink, scale=D ** -0.5)
    ref = sparse_attention_ref(q, wrows, widx, *comp, sink, scale=D ** -0.5)
    assert_within_bf16_probability_rounding(got, ref, torch.cat([wrows, crows]))


def _topk_of_visible(pos, ratio, k, gen):
    """Per token, up to k distinct visible entries (i < (pos+1)//ratio) in random order, -1 padded."""
    out = []
    for p in pos.tolist():
        pick = torch.randperm((p + 1) // ratio, generator=gen)[:k].tolist()
        out.append(pick + [-1] * (k - len(pick)))
    return i32(out)


@pytest.mark.parametrize("group", ["dense", "c4", "hca"])
@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_paged_pipeline_equals_attention_over_contiguous_keys(backend, group, gen):
    """Write K of two sequences into paged SWA and compressed rows, build indices, attend; compare with a
    direct computation over each sequence's contiguous K (window rows + the entries the group selects)."""
    kern = load_kernels(backend)
    bs, stride, window, ratio, k_pages, chunk_rows, D, H = 8, 11, 5, 4, 2, 5, 16, 3
    lens = [21, 14]
    swa_table = random_table(2, 3, 8, gen, p_missing=0.0)
    comp_table = random_table(2, 3, 8, gen, p_missing=0.0)
    keys = [torch.randn(n, D, generator=gen) for n in lens]
    entries = [torch.randn(n // ratio, D, generator=gen) for n in lens]
    _, swa_rows = arena_rows(8 * stride, D, torch.float32)
    _, comp_rows = arena_rows(4 * chunk_rows, D, torch.float32)
    seqs = i32([s for s, n in enumerate(lens) for _ in range(n)])
    pos = i32([p for n in lens for p in range(n)])
    kern.swa_write(torch.cat(keys), swa_rows, swa_table, seqs, pos, block_size=bs, row_stride=stride)
    ent_seq = i32([s for s, n in enumerate(lens) for _ in range(n // ratio)])
    ent_idx = i32([i for n in lens for i in range(n // ratio)])
    kern.compressed_write(torch.cat(entries), comp_rows, comp_table, ent_seq, ent_idx, entries_per_block=bs // ratio,
                          pages_per_chunk=k_pages, chunk_rows=chunk_rows)
    topk = _topk_of_visible(pos, ratio, 3, gen) if group == "c4" else None
    window_idx = kern.build_window_index(swa_table, seqs, pos, window=window, block_size=bs, row_stride=stride)
    comp = (None, None) if group == "dense" else (comp_rows, kern.build_comp_index(
        comp_table, seqs, pos, topk, width=3 if group == "c4" else 6, ratio=ratio, entries_per_block=bs // ratio,
        pages_per_chunk=k_pages, chunk_rows=chunk_rows))
    q = torch.randn(len(pos), H, D, generator=gen)
    sink = torch.randn(H, generator=gen)
    got = kern.sparse_attention(q, swa_rows, window_idx, *comp, sink, scale=0.25)
    t = 0
    for s, n in enumerate(lens):
        for p in range(n):
            chosen = {"dense": [], "hca": list(range((p + 1) // ratio)),
                      "c4": [i for i in (topk[t].tolist() if topk is not None else []) if i >= 0]}[group]
            ctx = torch.cat([keys[s][max(0, p - window + 1):p + 1], entries[s][chosen]])
            logits = 0.25 * (q[t] @ ctx.T)
            m = torch.maximum(logits.max(-1).values, sink)
            e = torch.exp(logits - m[:, None])
            want = (e @ ctx) / (e.sum(-1) + torch.exp(sink - m))[:, None]
            torch.testing.assert_close(got[t], want, rtol=1e-5, atol=1e-6)
            t += 1


BAD = {
    "q bf16, rows fp32": (dict(q=torch.zeros(2, 2, 4, dtype=torch.bfloat16)), "dtype"),
    "rows width": (dict(window_rows=torch.zeros(5, 3)), "width"),
    "index past the rows": (dict(window_idx=i32([[0, 5], [1, 2]])), "window_idx"),
    "index int64": (dict(window_idx=torch.zeros(2, 2, dtype=torch.int64)), "int32"),
    "index rows differ from tokens": (dict(window_idx=i32([[0, 1]])), "shape"),
    "comp rows without comp index": (dict(comp_idx=None), "together"),
    "sink per head": (dict(sink=torch.zeros(3)), "width"),
    "sink -inf": (dict(sink=torch.tensor([0.0, float("-inf")])), "finite"),
    "q inner dim strided": (dict(q=torch.zeros(2, 2, 8)[:, :, ::2]), "contiguous"),
}


@pytest.mark.parametrize("case", list(BAD))
@pytest.mark.parametrize("fn", [sparse_attention, sparse_attention_ref], ids=["triton", "torch"])
def test_wrapper_rejects_bad_arguments(fn, case):
    args = dict(q=torch.zeros(2, 2, 4), window_rows=torch.zeros(5, 4), window_idx=i32([[0, 1], [2, -1]]),
                comp_rows=torch.zeros(3, 4), comp_idx=i32([[0], [-1]]), sink=torch.zeros(2))
    change, needle = BAD[case]
    args.update(change)
    with pytest.raises(ValueError, match=needle):
        fn(args["q"], args["window_rows"], args["window_idx"], args["comp_rows"], args["comp_idx"], args["sink"],
           scale=0.5)


@pytest.mark.parametrize("fn", [sparse_attention, sparse_attention_ref], ids=["triton", "torch"])
def test_masked_slots_never_read_row_zero_of_a_nan_arena(fn, gen):
    rows = torch.randn(6, 16, generator=gen)
    rows[0] = float("nan")  # unwritten arena memory
    widx = i32([[-1, 3, 4], [-1, -1, -1]])
    out = fn(torch.randn(2, 2, 16, generator=gen), rows, widx, rows, i32([[-1, 5], [-1, 2]]),
             torch.zeros(2), scale=0.25)
    assert not bool(out.isnan().any())


@pytest.fixture
def split_keys(monkeypatch):
    """Interpreter tiles that split every token's key list into pieces of two 16-row steps."""
    monkeypatch.setitem(TILES, "interpreter", dataclasses.replace(TILES["interpreter"], attn_rows=16,
                                                                  attn_split_below=10 ** 6))


def test_key_splits_fill_the_gpu_with_whole_steps_and_leave_a_full_one_unsplit():
    assert key_splits(4, 640, 16, 264) == (20, 32)  # min(264 / 4, 640 / 32) = 20 splits of 32 keys
    assert key_splits(4, 100, 16, 264) == (4, 32)  # 100 keys: 4 splits of 2 steps, the last short
    assert key_splits(264, 640, 16, 264) == (1, 640)  # the GPU is full: one program per token and head block
    assert key_splits(1, 32, 16, 264) == (1, 32)  # two steps or fewer: nothing to split


@pytest.mark.parametrize("T,H,D,W,Kc", [(1, 5, 24, 16, 70), (3, 20, 32, 40, 0), (2, 4, 16, 9, 37)],
                         ids=["one-token", "window-only-heads-past-a-tile", "ragged-short-window"])
def test_split_keys_and_the_combine_equal_the_reference_in_fp32(split_keys, T, H, D, W, Kc, gen):
    q, wrows, widx, crows, cidx, sink = random_case(T, H, D, 30, 50, W, Kc, gen)
    widx[0, : W // 2] = -1
    comp = (crows, cidx) if Kc else (None, None)
    assert W + Kc > 2 * 16  # more than two 16-row steps: the list is split
    got = sparse_attention(q, wrows, widx, *comp, sink, scale=D ** -0.5)
    ref = sparse_attention_ref(q, wrows, widx, *comp, sink, scale=D ** -0.5)
    torch.testing.assert_close(got, ref, rtol=2e-5, atol=2e-6)


def test_a_token_with_no_valid_key_in_any_split_outputs_zero(split_keys, gen):
    q, wrows, widx, crows, cidx, sink = random_case(2, 4, 16, 10, 10, 40, 40, gen)
    widx[1], cidx[1] = -1, -1
    got = sparse_attention(q, wrows, widx, crows, cidx, sink, scale=0.25)
    assert bool((got[1] == 0).all())
    torch.testing.assert_close(got, sparse_attention_ref(q, wrows, widx, crows, cidx, sink, scale=0.25),
                               rtol=2e-5, atol=2e-6)


def test_split_keys_in_bf16_stay_within_the_probability_rounding(split_keys, gen):
    q, wrows, widx, crows, cidx, sink = random_case(2, 20, 32, 20, 40, 24, 50, gen, dtype=torch.bfloat16)
    got = sparse_attention(q, wrows, widx, crows, cidx, sink, scale=32 ** -0.5)
    ref = sparse_attention_ref(q, wrows, widx, crows, cidx, sink, scale=32 ** -0.5)
    assert_within_bf16_probability_rounding(got, ref, torch.cat([wrows, crows]))


@pytest.fixture
def split_by_step(monkeypatch):
    """Interpreter tiles that split key lists into 16-row steps until a step has 8 programs, as a GPU splits
    until it is full: the split then follows the step's token count and its lists' width."""
    monkeypatch.setitem(TILES, "interpreter", dataclasses.replace(TILES["interpreter"], attn_rows=16,
                                                                  attn_split_below=8))


def _widened(idx: torch.Tensor, width: int) -> torch.Tensor:
    """``idx`` with -1 columns after its own up to ``width`` (how a step pads a request's list)."""
    return torch.cat([idx, torch.full((idx.shape[0], width - idx.shape[1]), -1, dtype=idx.dtype)], dim=1)


def test_with_fixed_key_blocks_a_tokens_output_ignores_its_lists_padding_and_the_other_tokens(split_by_step, gen):
    q, wrows, widx, crows, cidx, sink = random_case(3, 4, 16, 30, 90, 16, 200, gen)

    def first_token(tokens: int, width: int) -> torch.Tensor:
        out = sparse_attention(q[:tokens], wrows, widx[:tokens], crows, _widened(cidx[:tokens], width), sink,
                               scale=0.25)
        return out[0]

    with fixed_key_blocks():
        alone, padded, in_company = first_token(1, 200), first_token(1, 400), first_token(3, 200)
    assert torch.equal(alone, padded) and torch.equal(alone, in_company)
    torch.testing.assert_close(alone, sparse_attention_ref(q[:1], wrows, widx[:1], crows, cidx[:1], sink,
                                                           scale=0.25)[0], rtol=2e-5, atol=2e-6)
    # outside the scope the split follows the step (7 splits of 32 keys alone, 7 of 64 padded, 3 of 80 with
    # two more tokens), and so do the last bits
    assert [key_splits(t, 16 + w, 16, 8) for t, w in ((1, 200), (1, 400), (3, 200))] == [(7, 32), (7, 64), (3, 80)]
    assert not torch.equal(first_token(1, 200), first_token(1, 400))
    assert not torch.equal(first_token(1, 200), first_token(3, 200))
