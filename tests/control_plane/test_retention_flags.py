"""ATOM_SWA_FULL_RETAIN / ATOM_SWA_RETENTION_INTERVAL: one test per documented rule (docs/prefix_cache.md)."""

import pytest

from atom.config import CacheConfig
from atom.kv.page_map import COMPRESS, SWA

SHARED = list(range(100, 164))  # 4 blocks of 16


def run_one(h, tokens, max_tokens=1):
    seq = h.add(tokens, max_tokens=max_tokens)
    h.run()
    return seq


def test_default_mode_frees_swa_blocks_that_leave_the_window_so_no_mid_sequence_hit(harness):
    h = harness(budget=200)
    run_one(h, SHARED + list(range(300, 400)))
    # blocks 0-8 left the window during the run and were freed; only block 9, held at the end, is cached
    assert h.bm.swa.pool.num_cached() == 1
    later = run_one(h, SHARED + [1, 2, 3])
    assert later.stats.reused == 0 and later.stats.lost_to_swa_window == 64


def test_default_mode_keeps_the_tail_a_finished_request_still_held(harness):
    h = harness(budget=200, spec_overrides={"sliding_window": 16})
    first = run_one(h, SHARED + [9], max_tokens=1)  # computed 65 tokens: block 3 was in the window at the end
    turn2 = run_one(h, first.token_ids + [5, 6, 7])
    assert turn2.stats.reused == 64


def test_default_mode_keeps_the_window_before_the_prompt_boundary_so_a_repeat_hits(harness):
    h = harness(budget=200)
    prompt = list(range(700, 750))  # 50 tokens: a repeat resumes at block boundary 3 (token 48)
    run_one(h, prompt, max_tokens=30)  # block 2 left the window long before the request ended
    repeat = run_one(h, prompt, max_tokens=2)
    assert repeat.stats.reused == 48


def test_default_mode_returns_blocks_that_came_from_the_cache(harness):
    h = harness(budget=200)
    prompt = list(range(700, 750))
    run_one(h, prompt, max_tokens=30)
    run_one(h, prompt + list(range(800, 860)), max_tokens=2)  # hits at 48, then runs far past it
    assert run_one(h, prompt, max_tokens=2).stats.reused == 48


def test_default_mode_keeps_the_window_at_a_shared_prefix_junction_for_the_next_request(harness):
    h = harness(budget=200)
    first = run_one(h, SHARED + list(range(300, 340)))  # computes the shared prefix, frees its window
    second = run_one(h, SHARED + list(range(400, 440)))  # compressed blocks match; the window is gone
    third = run_one(h, SHARED + list(range(500, 540)))
    assert (first.stats.reused, second.stats.reused) == (0, 0)
    assert second.stats.lost_to_swa_window == 64
    assert third.stats.reused == 64


def test_full_retain_keeps_published_blocks_after_they_leave_the_window(harness):
    h = harness(budget=200, full_retain=True)
    run_one(h, SHARED + list(range(300, 400)))
    assert h.bm.swa.pool.num_cached() >= 6
    later = run_one(h, SHARED + [1, 2, 3])
    assert later.stats.reused == 64


def test_retention_interval_pins_checkpoints_that_survive_pressure(harness):
    h = harness(num_chunks=24, budget=64, full_retain=True, interval=64, pin_fraction=0.5)
    run_one(h, SHARED + list(range(300, 340)))
    # checkpoints: the block ending at token 64 (block 3) and the prompt-boundary block (block 5)
    pins = set(h.bm.swa.pinned_ids())
    assert len(pins) == 2
    for i in range(8):  # unrelated requests fill the arena; each adds one prompt-boundary pin
        run_one(h, [(991 * j + 17 * i) % 997 for j in range(47)], max_tokens=4)
    assert h.bm.swa.pool.num_evictions > 0  # unpinned cached SWA blocks were evicted
    assert pins <= set(h.bm.swa.pinned_ids())
    later = run_one(h, SHARED + [1, 2, 3])
    assert later.stats.reused == 64


def test_pins_are_capped_and_the_least_recently_used_pin_is_released(harness):
    h = harness(num_chunks=40, budget=256, full_retain=True, interval=16, pin_fraction=0.1)
    cap = h.bm.swa.max_pins
    assert cap == 4
    run_one(h, list(range(200)))
    assert h.bm.swa.num_pins == cap
    newest = h.bm.swa.pinned_ids()
    run_one(h, list(range(500, 540)))
    assert h.bm.swa.num_pins == cap and h.bm.swa.pinned_ids()[:2] == newest[2:]


def test_pins_never_starve_a_request_that_needs_their_memory(harness):
    # every block is a checkpoint and pins may take the whole arena: the request's own pins would
    # fill the 7 chunks (one holds its state page) long before its 200 tokens are done, so the
    # oldest pins must give way
    h = harness(num_chunks=7, budget=64, full_retain=True, interval=16, pin_fraction=1.0)
    first = run_one(h, list(range(200)), max_tokens=1)
    second = run_one(h, list(range(300, 400)), max_tokens=3)
    assert first.num_output_tokens == 1 and second.num_output_tokens == 3
    assert first.error is None and second.error is None
    assert 0 < h.bm.swa.num_pins < 200 // 16


def test_a_pin_is_released_when_its_compressed_prefix_is_evicted(harness):
    h = harness(full_retain=True, interval=16)
    seq = run_one(h, SHARED + [1])
    assert h.bm.swa.num_pins == 4
    h.bm.comp.pool.evict(h.bm.published_block(COMPRESS, seq, 3))
    assert h.bm.swa.num_pins == 3


def test_a_retention_interval_needs_full_retain_and_a_whole_number_of_blocks(harness):
    with pytest.raises(ValueError, match="needs swa_full_retain"):
        CacheConfig(kv_cache_bytes=1 << 24, swa_retention_interval=32)
    with pytest.raises(ValueError, match="multiple of the block size 16"):
        harness(full_retain=True, interval=24)


def test_eviction_keeps_an_swa_window_that_unlocks_a_cached_document_over_ones_that_unlock_nothing(harness):
    h = harness(full_retain=True, spec_overrides={"sliding_window": 8})
    a = run_one(h, list(range(500, 549)))  # SWA blocks 0..2 cached, with their compressed prefix
    b = run_one(h, list(range(600, 649)))  # cached later (younger) ...
    for j in range(3):  # ... but its compressed blocks are gone: its windows unlock nothing
        h.bm.comp.pool.evict(h.bm.published_block(COMPRESS, b, j))
    swa = h.bm.swa.pool
    names = {h.bm.published_block(SWA, s, j): f"{tag}{j}" for tag, s in (("a", a), ("b", b)) for j in range(3)}
    order = []
    while swa.evict_lru():
        order += [n for bid, n in names.items() if n not in order and not swa.is_cached(bid)]
    assert order == ["b0", "b1", "b2", "a0", "a1", "a2"]  # plain LRU would evict a0, a1, a2 first
