"""dsv4_model.md section 6 invariants 1-5 and 10: prefill/decode/chunking equivalence, snapshot/restore into a
NaN-poisoned cache, immutability of compressed entries, causality, batch isolation and state reset."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.dsv4 import SEQ, run_chunks, state_equal, tokens
from support.params import fast_subset

from atom.models.deepseek_v4.cache import cache_tensors


@pytest.fixture(scope="module")
def one_prefill(bi_model):
    """``(logits, cache)`` of ``tokens()`` prefilled in one chunk: the baseline most tests compare with, computed
    once per module (tests only read it)."""
    return run_chunks(bi_model, tokens(), [SEQ])


def test_prefill_then_decode_equals_one_prefill_bit_exactly(bi_model, one_prefill):
    toks = tokens()
    full, _ = one_prefill
    cache = bi_model.new_cache(128)
    bi_model.prefill(cache, toks[:5])
    decoded = torch.cat([bi_model.extend(cache, toks[t : t + 1], t).logits for t in range(5, SEQ)])
    assert torch.equal(decoded, full[5:])


@pytest.mark.parametrize("prefix", fast_subset((1, 4, 9, 16, 33), fast=(1, 9, 33)))
def test_logits_of_a_prefix_prefill_equal_the_same_positions_of_a_longer_prefill(bi_model, one_prefill, prefix):
    toks = tokens()
    full, _ = one_prefill
    short = bi_model.prefill(bi_model.new_cache(64), toks[:prefix]).logits
    assert torch.equal(short, full[:prefix])


def test_decode_matches_prefill_within_fp32_tolerance_in_default_mode(model):
    toks = tokens()
    full, _ = run_chunks(model, toks, [SEQ])
    step, _ = run_chunks(model, toks, [1])
    torch.testing.assert_close(step, full, rtol=1e-5, atol=1e-5)


# the fast loop keeps one chunk size per case: one token, unaligned (3), block-aligned (16) and one past (17)
@pytest.mark.parametrize("chunk", fast_subset((1, 3, 4, 5, 7, 8, 15, 16, 17), fast=(1, 3, 16, 17)))
def test_chunked_extend_equals_one_prefill_in_logits_and_state(bi_model, one_prefill, chunk):
    toks = tokens()
    full, full_cache = one_prefill
    chunked, cache = run_chunks(bi_model, toks, [chunk])
    assert torch.equal(chunked, full)
    assert state_equal(cache, full_cache, bi_model)


@pytest.mark.parametrize("sizes", [
    [7, 2, 30],        # window edge (8) crossed inside the 2nd chunk; CSA block 2 straddled
    [3, 2, 11, 1, 23],  # chunks ending at 3, 5, 16, 17: CSA and HCA block ends straddled
    [15, 2, 14, 9],     # HCA block 0 completes at 15 inside chunk 2, HCA block 1 at 31 inside chunk 3
    [1, 1, 2, 36],
])
def test_chunks_straddling_window_and_block_boundaries_equal_one_prefill(bi_model, one_prefill, sizes):
    toks = tokens()
    full, full_cache = one_prefill
    chunked, cache = run_chunks(bi_model, toks, sizes)
    assert torch.equal(chunked, full)
    assert state_equal(cache, full_cache, bi_model)


@pytest.mark.slow
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cuts=st.lists(st.integers(1, SEQ - 1), min_size=1, max_size=5, unique=True))
def test_any_random_split_into_chunks_equals_one_prefill(bi_model, one_prefill, cuts):
    bounds = [0] + sorted(cuts) + [SEQ]
    toks = tokens()
    full, full_cache = one_prefill
    chunked, cache = run_chunks(bi_model, toks, [b - a for a, b in zip(bounds, bounds[1:])])
    assert torch.equal(chunked, full)
    assert state_equal(cache, full_cache, bi_model)


@pytest.mark.parametrize("chunk", [1, 5, 16])
def test_chunked_extend_matches_prefill_within_fp32_tolerance_in_default_mode(model, chunk):
    toks = tokens()
    full, _ = run_chunks(model, toks, [SEQ])
    chunked, _ = run_chunks(model, toks, [chunk])
    torch.testing.assert_close(chunked, full, rtol=1e-5, atol=1e-5)


# P = 1, 3, 4, 5 cover 1/3/0/1 mod 4; 15, 16, 17, 31, 32 cover 15/0 mod 16 (aligned and unaligned); the fast
# loop keeps 3, 4, 17 and 32 (3/0/1 mod 4, 0 and 1 mod 16)
@pytest.mark.parametrize("p", fast_subset((1, 3, 4, 5, 15, 16, 17, 31, 32), fast=(3, 4, 17, 32)))
def test_snapshot_restored_into_a_nan_poisoned_cache_continues_bit_exactly(bi_model, p):
    toks = tokens()
    n_cont = 3
    ref = bi_model.new_cache(128)
    bi_model.extend(ref, toks[:p], 0)
    snap = bi_model.snapshot(ref)
    expect = [bi_model.extend(ref, toks[q : q + n_cont], q).logits for q in range(p, SEQ, n_cont)]

    poisoned = bi_model.new_cache(128, poison=float("nan"))
    bi_model.restore(snap, poisoned)
    got = [bi_model.extend(poisoned, toks[q : q + n_cont], q).logits for q in range(p, SEQ, n_cont)]
    assert torch.equal(torch.cat(got), torch.cat(expect))
    assert state_equal(poisoned, ref, bi_model)


def test_snapshot_without_the_csa_overlap_rows_is_caught_by_the_poison(bi_model):
    """Control for the test above: dropping the previous CSA block's rows makes the continuation read NaN."""
    toks = tokens()
    cache = bi_model.new_cache(128)
    bi_model.extend(cache, toks[:6], 0)
    snap = bi_model.snapshot(cache)
    for ls in snap.layers:
        if ls.index_state_rows is not None:  # CSA layers: rows of positions 0..5
            ls.state_positions = ls.state_positions[4:]
            ls.state_rows = tuple(r[4:] for r in ls.state_rows)
            ls.index_state_rows = tuple(r[4:] for r in ls.index_state_rows)
    poisoned = bi_model.new_cache(128, poison=float("nan"))
    bi_model.restore(snap, poisoned)
    out = bi_model.extend(poisoned, toks[6:8], 6).logits  # token 7 completes CSA block 1, which needs block 0
    assert torch.isfinite(out[0]).all()
    assert torch.isnan(out[1]).all()


def test_prefill_into_a_nan_poisoned_cache_reads_only_what_it_wrote(bi_model, one_prefill):
    toks = tokens()
    full, _ = one_prefill
    poisoned = bi_model.new_cache(128, poison=float("nan"))
    got, _ = run_chunks(bi_model, toks, [6], cache=poisoned)
    assert torch.equal(got, full)


def test_compressed_entries_are_written_once_at_the_block_end_and_never_change(bi_model):
    toks = tokens()
    cache = bi_model.new_cache(128, poison=float("nan"))
    written: dict[tuple[int, int], torch.Tensor] = {}
    for t in range(SEQ):
        bi_model.extend(cache, toks[t : t + 1], t)
        for k, lc in enumerate(cache.layers[: bi_model.cfg.n_layers]):
            if lc.entries is None:
                continue
            n = (t + 1) // lc.ratio
            finite = torch.isfinite(lc.entries).all(dim=1)
            assert finite.nonzero().flatten().tolist() == list(range(n))
            if lc.index_keys is not None:
                assert torch.isfinite(lc.index_keys).all(dim=1).nonzero().flatten().tolist() == list(range(n))
            for i in range(n):
                first = written.setdefault((k, i), lc.entries[i].clone())
                assert torch.equal(lc.entries[i], first)
    assert len(written) == 3 * (SEQ // 4) + 2 * (SEQ // 16)


@pytest.mark.parametrize("p", [5, 16, 23])
def test_tokens_after_p_change_nothing_before_p(bi_model, one_prefill, p):
    toks = tokens()
    other = toks.clone()
    other[p:] = (other[p:] + 1 + torch.arange(SEQ - p)) % 512
    a, ca = run_chunks(bi_model, toks[:p], [p])
    b, cb = run_chunks(bi_model, other, [SEQ])
    assert torch.equal(b[:p], a)
    assert not torch.equal(b[p:], one_prefill[0][p:])
    for la, lb in zip(ca.layers, cb.layers):
        if la.entries is not None:
            n = p // la.ratio
            assert torch.equal(lb.entries[:n], la.entries[:n])


def test_a_batch_of_sequences_with_different_lengths_equals_separate_runs(bi_model):
    seqs = [tokens(n, seed=s) for n, s in ((SEQ, 2), (7, 3), (19, 4))]
    alone = [run_chunks(bi_model, s, [s.numel()])[0] for s in seqs]
    caches = [bi_model.new_cache(128) for _ in seqs]
    first = bi_model.forward_batch(caches, [s[:5] for s in seqs], [0, 0, 0])
    rest = bi_model.forward_batch(caches, [s[5:] for s in seqs], [5, 5, 5])
    for k in range(len(seqs)):
        assert torch.equal(torch.cat((first[k].logits, rest[k].logits)), alone[k])


@pytest.mark.parametrize("short", [1, 2, 3])
def test_compressor_state_is_reset_for_a_new_sequence_shorter_than_a_block(bi_model, short):
    toks, new = tokens(), tokens(12, seed=9)
    fresh, fresh_cache = run_chunks(bi_model, new, [short, 12 - short])
    reused = bi_model.new_cache(128)
    bi_model.prefill(reused, toks)  # leaves non-trivial compressor state behind
    got = [bi_model.prefill(reused, new[:short]).logits, bi_model.extend(reused, new[short:], short).logits]
    assert torch.equal(torch.cat(got), fresh)
    assert state_equal(reused, fresh_cache, bi_model)


def test_extend_rejects_a_start_position_that_is_not_the_cache_length(bi_model):
    cache = bi_model.new_cache(32)
    bi_model.prefill(cache, tokens(4))
    with pytest.raises(ValueError, match="start_pos=3"):
        bi_model.extend(cache, tokens(1), 3)


def test_cache_tensors_hold_exactly_the_expected_state_per_layer_type(bi_model):
    cfg = bi_model.cfg
    cache = bi_model.new_cache(64)
    sizes = {k: [tuple(t.shape) for t in cache_tensors_of(lc)] for k, lc in enumerate(cache.layers)}
    c, ci = cfg.head_dim, cfg.index_head_dim
    assert sizes[0] == [(8, c)]                                           # SWA only
    assert sizes[1] == [(8, c), (16, c), (8, 2 * c), (8, 2 * c), (16, ci), (8, 2 * ci), (8, 2 * ci)]  # CSA
    assert sizes[2] == [(8, c), (4, c), (16, c), (16, c)]                  # HCA(16)
    assert sizes[6] == [(8, c)]                                           # MTP: SWA only, W rows
    assert math.prod((8, c)) * 4 == cache.layers[6].swa.nbytes


def cache_tensors_of(lc):
    out = [lc.swa]
    if lc.entries is not None:
        out += [lc.entries, lc.state.kv, lc.state.score]
    if lc.index_keys is not None:
        out += [lc.index_keys, lc.index_state.kv, lc.index_state.score]
    return out


def test_every_cache_tensor_is_listed_by_cache_tensors(bi_model):
    cache = bi_model.new_cache(64)
    assert sum(len(cache_tensors_of(lc)) for lc in cache.layers) == len(cache_tensors(cache))
