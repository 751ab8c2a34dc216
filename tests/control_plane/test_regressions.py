"""Regression tests, each built from the repro of a bug an adversarial run of the real scheduler,
block manager and content model found."""

from array import array

import atom.model_engine.sequence as sequence_module
from atom.kv.page_map import COMPRESS
from atom.model_engine.sequence import Sequence, SequenceStatus
from atom.sampling_params import SamplingParams


def unique(n, salt):
    return [(salt * 131 + 7 * i) % 997 for i in range(n)]


def test_a_request_of_the_length_the_arena_was_sized_for_runs_after_scattered_cached_pages(harness):
    # window 49 (3 tail blocks), 2 SWA pages per chunk, the smallest arena for max_model_len 512:
    # the short request's cached pages share chunks with the long one's, which used to be dropped
    h = harness(num_chunks=7, chunk_pages=2, max_model_len=512, budget=16, spec_overrides={"sliding_window": 49})
    short = h.add(range(1, 15), max_tokens=3)
    long = h.add(unique(511, 1), max_tokens=1)
    h.run()
    assert short.status is SequenceStatus.FINISHED_LENGTH
    assert long.status is SequenceStatus.FINISHED_LENGTH and long.error is None
    assert long.output_token_ids == [h.runner.token_for(long.seq_id, 511)]
    h.assert_all_memory_returned()


def test_one_fewer_chunk_than_the_promise_is_refused_at_sizing(harness):
    import pytest

    from atom.kv.kv_layout import InsufficientKvMemory

    with pytest.raises(InsufficientKvMemory, match="7 chunks"):
        harness(num_chunks=6, chunk_pages=2, max_model_len=512, spec_overrides={"sliding_window": 49})


def fill_cache(h):
    """Two finished requests leave cached compressed and SWA blocks (and retention pins)."""
    for salt in (2, 3):
        h.add(unique(64, salt), max_tokens=1)
    h.run()
    return h.bm.comp.pool.num_cached(), h.bm.swa.pool.num_cached(), h.bm.swa.num_pins


def test_an_allocation_that_cannot_fit_evicts_nothing_and_releases_no_pin(harness):
    h = harness(num_chunks=12, max_model_len=512, budget=512, full_retain=True, interval=32)
    before = fill_cache(h)
    assert before[0] > 0 and before[1] > 0 and before[2] > 0
    big = Sequence(unique(500, 9), SamplingParams(max_tokens=1), h.bm.block_size)
    assert h.bm.admit(big, 500) == 0  # 32 compressed + 32 SWA pages > 12 chunks, even after eviction
    assert (h.bm.comp.pool.num_cached(), h.bm.swa.pool.num_cached(), h.bm.swa.num_pins) == before
    h.bm.check_integrity([])


def test_a_waiting_request_whose_first_chunk_does_not_fit_leaves_a_hot_prefix_cached(harness):
    h = harness(num_chunks=14, max_model_len=512, budget=256, full_retain=True)
    hot = unique(64, 4)
    h.add(hot, max_tokens=1)
    h.run()
    runner = h.add(unique(120, 5), max_tokens=40)  # holds most of the arena while it decodes
    h.step()
    big = h.add(unique(300, 6), max_tokens=1)
    for _ in range(3):
        h.step()
        assert big.status is SequenceStatus.WAITING
    again = h.add(hot + [1], max_tokens=1)
    assert h.bm.match_prefix(again).blocks == 64 // h.bm.block_size
    h.run()
    assert runner.status is SequenceStatus.FINISHED_LENGTH and again.stats.reused == 64


def test_window_releases_of_a_running_request_that_got_no_tokens_reach_the_runner(harness):
    # window 15, 14 chunks, budget 128: B's prefill takes the budget while C has its window
    # released; the runner's table must follow (the harness compares both tables every step)
    h = harness(num_chunks=14, budget=128, max_model_len=512, spec_overrides={"sliding_window": 15})
    h.add(unique(100, 7), max_tokens=4)
    h.step()
    b = h.add(unique(400, 8), max_tokens=2)
    c = h.add(unique(40, 9), max_tokens=30)
    h.run()
    assert b.status is c.status is SequenceStatus.FINISHED_LENGTH
    h.assert_all_memory_returned()


def test_a_preempted_request_reports_only_its_first_admissions_cached_tokens(harness):
    h = harness(num_chunks=10, budget=64, max_seqs=4, max_model_len=160)
    seqs = [h.add(unique(40, 20 + i), max_tokens=60) for i in range(4)]
    h.run()
    assert h.sched.num_preemptions > 0
    assert all(s.stats.reused == 0 for s in seqs)  # distinct prompts: nothing was cached at first
    assert h.bm.counters.reused == 0 and h.bm.counters.prompt_tokens == 4 * 40



def test_the_engine_reports_first_admission_cached_tokens_after_preemption(harness):
    h = harness(num_chunks=10, budget=64, max_seqs=4, max_model_len=160)
    engine = h.engine
    ids = [engine.add_request(unique(40, 30 + i), SamplingParams(max_tokens=60)) for i in range(4)]
    final = {}
    while engine.has_unfinished_requests():
        final.update({o.request_id: o for o in engine.step() if o.finished})
    assert h.sched.num_preemptions > 0
    assert [final[i].num_cached_tokens for i in ids] == [0, 0, 0, 0]
    stats = engine.stats()
    assert stats.prefix.reused == 0 and stats.prefix.prompt_tokens == 160


def test_an_abort_that_leaves_the_engine_idle_still_reaches_the_runner(harness):
    h = harness()
    engine = h.engine
    rid = engine.add_request(unique(30, 40), SamplingParams(max_tokens=5))
    engine.step()
    assert list(h.runner.tables) == [h.sched.running[0].seq_id]
    engine.abort_request(rid)
    engine.step()
    assert h.runner.tables == {}


def test_24_requests_sharing_a_4096_token_prefix_in_one_step_all_hit_except_the_first(harness):
    h = harness(num_chunks=600, budget=8192, max_seqs=24, max_model_len=4200)
    prefix = unique(4096, 50)
    seqs = [h.add(prefix + [i + 1, i + 2, i + 3], max_tokens=2) for i in range(24)]
    h.run()
    assert all(s.status is SequenceStatus.FINISHED_LENGTH for s in seqs)
    assert seqs[0].stats.reused == 0
    assert [s.stats.reused for s in seqs[1:]] == [4096] * 23
    assert h.bm.waits_for_prefix > 0
    h.assert_all_memory_returned()


def forgetful_hashes(token_ids, block_size, num_blocks, hashes, keys):
    """The worst truncated hash: it forgets the prefix, so equal blocks collide under any prefix."""
    for j in range(len(hashes), num_blocks):
        key = array("q", token_ids[j * block_size:(j + 1) * block_size]).tobytes()
        hashes.append(hash(key))
        keys.append(key)


def test_a_hash_collision_under_another_prefix_is_never_served(harness, monkeypatch):
    monkeypatch.setattr(sequence_module, "chain_hashes", forgetful_hashes)
    h = harness(budget=64, spec_overrides={"sliding_window": 8})
    x_other, x, rest = unique(16, 60), unique(16, 61), unique(32, 62)
    a = h.add(x_other + rest + [1], max_tokens=1)  # publishes X', Y, Z
    h.run()
    h.bm.comp.pool.evict(h.bm.published_block(COMPRESS, a, 0))  # X' goes; Y and Z stay cached under it
    h.add(x + rest + [2], max_tokens=1)  # computes X, Y, Z under X and publishes them at nodes of its own
    h.run()
    d = h.add(x + rest + [3], max_tokens=1)
    index = h.bm.index
    mine, theirs = (index.chain(s.hashes_upto(3), s.block_keys, 3) for s in (d, a))
    # blocks Y and Z hash, key and tokens alike under X' and X, but each prefix has its own nodes
    assert d.hashes_upto(3)[1:] == a.hashes_upto(3)[1:] and len(theirs) == 3
    assert len(mine) == 3 and set(mine).isdisjoint(theirs) and h.bm.match_prefix(d).compressed == 3
    h.run()  # the content model fails any read of a row computed under X'
    assert d.status is SequenceStatus.FINISHED_LENGTH and d.stats.reused == 48  # X, Y, Z: all computed under X
    h.assert_all_memory_returned()
