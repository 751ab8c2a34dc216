"""Prefix hits resume the model bit-exactly: a hit at block boundary P (CSA boundary state restored
from the SWA page, arena NaN-poisoned) gives logits bit-identical to a cold run whose prefill was
split at P; a hit that cannot be served falls back instead of reading stale rows."""

import functools

import pytest
import torch

from atom.kv.page_map import COMPRESS
from atom.sampling_params import SamplingParams

GREEDY = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
PROMPT = [(53 * i + 7) % 500 + 1 for i in range(70)]


def run_steps(engine, tokens, params=GREEDY):
    """Run one request alone; return (sequence, [(its ScheduledSeq, its logits)] of every step)."""
    seq = engine.sequence(engine.add_request(tokens, params))
    steps = []
    while engine.has_unfinished_requests():
        step = engine.step_detailed()
        steps += [(item, step.output.logits[item.seq_id]) for item in step.batch.seqs]
        engine.check_integrity()
    return seq, steps


def run(engine, tokens, params=GREEDY):
    """Run one request alone; return (sequence, [(start, logits)] of every step)."""
    seq, steps = run_steps(engine, tokens, params)
    return seq, [(item.start_pos, logits) for item, logits in steps]


def after(steps, pos):
    return [(s, lg) for s, lg in steps if s >= pos]


def assert_bit_identical(a, b):
    assert [s for s, _ in a] == [s for s, _ in b]
    for (_, x), (_, y) in zip(a, b):
        assert torch.equal(x, y)
        assert not torch.isnan(x).any()


@pytest.fixture(scope="module")
def cold_run(make_engine):
    """``boundary`` -> (sequence, [(start, logits)] of every step) of ``PROMPT`` on a fresh engine whose
    prefill is split at ``boundary``: made once per boundary, since three tests compare against the one
    at 32."""
    return functools.cache(lambda boundary: run(make_engine(budget=boundary), PROMPT))


@pytest.mark.parametrize("boundary", [16, 32, 48])
def test_a_prefix_hit_continues_bit_identically_to_a_cold_run_split_at_the_boundary(make_engine, cold_run, boundary):
    cold_seq, cold = cold_run(boundary)
    engine = make_engine(budget=boundary)  # arena poisoned with NaN
    run(engine, PROMPT[:boundary], SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
    hit_seq, hit = run(engine, PROMPT)
    assert hit_seq.num_cached_tokens == boundary and hit_seq.stats.reused == boundary
    assert hit_seq.output_token_ids == cold_seq.output_token_ids
    assert_bit_identical(after(cold, boundary), hit)


def test_a_hit_served_from_a_chunk_the_compress_owner_held_before_is_still_exact(make_engine, cold_run):
    boundary = 32
    cold_seq, cold = cold_run(boundary)
    engine = make_engine(budget=boundary, num_chunks=6)
    bm = engine.scheduler.bm
    run(engine, [(11 * i) % 500 + 1 for i in range(400)], SamplingParams(max_tokens=2, temperature=0.0))
    compress_chunks = {bm.arena.chunk_of(COMPRESS, bm.comp.pool.page(b)) for b in range(bm.comp.pool.num_ids)
                       if bm.arena.is_backed(COMPRESS, b)}
    assert compress_chunks
    bm.reset_prefix_cache()  # those chunks return to the arena, still holding compressed rows
    run(engine, PROMPT[:boundary], SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
    hit_seq, steps = run_steps(engine, PROMPT)
    restore = steps[0][0].restore_page
    hit = [(item.start_pos, logits) for item, logits in steps]
    assert restore >= 0 and restore // bm.arena.pages_per_chunk("swa") in compress_chunks
    assert hit_seq.num_cached_tokens == boundary
    assert_bit_identical(after(cold, boundary), hit)


def test_after_the_prefix_swa_blocks_are_evicted_the_request_recomputes_instead_of_reading_stale_rows(make_engine,
                                                                                                        cold_run):
    boundary = 32
    cold_seq, cold = cold_run(boundary)
    engine = make_engine(budget=boundary)
    run(engine, PROMPT[:boundary], SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
    swa = engine.scheduler.bm.swa.pool
    while swa.evict_lru():  # the compressed blocks stay cached; the SWA window does not
        pass
    seq, steps = run(engine, PROMPT)
    assert seq.num_cached_tokens == 0 and seq.stats.lost_to_swa_window == boundary
    assert_bit_identical(cold, steps)


def test_a_second_turn_reuses_the_first_turns_prompt_and_answer(make_engine):
    engine = make_engine(budget=64)
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    first, _ = run(engine, PROMPT[:40], params)
    turn2 = first.token_ids + [9, 8, 7, 6, 5]
    second, _ = run(engine, turn2, params)
    assert second.num_cached_tokens == 48  # 3 full blocks of prompt + answer (51 tokens computed)
    fresh, _ = run(make_engine(budget=64, prefix_caching=False), turn2, params)
    assert fresh.num_cached_tokens == 0
    assert second.output_token_ids == fresh.output_token_ids
