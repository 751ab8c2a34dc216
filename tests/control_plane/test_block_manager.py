"""BlockManager and pools: exact ids, eviction order, hits bounded by window and CSA state."""

import pytest

from atom.kv.block_pool import BlockPool
from atom.kv.prefix_index import PrefixIndex
from atom.kv.page_map import COMPRESS, SWA
from atom.kv.unified_kv_arena import UnifiedKvArena


def test_a_repeated_prompt_reuses_its_full_blocks_and_recomputes_the_last_one(harness):
    h = harness(budget=64, spec_overrides={"sliding_window": 16})
    a = h.add(range(50), max_tokens=2)
    h.step()
    assert h.held(a).comp.blocks == [0, 1, 2, 3]
    h.run()
    b = h.add(range(50), max_tokens=2)
    h.step()
    assert h.held(b).hit_blocks == 3 and b.num_cached_tokens == 48 and b.stats.reused == 48
    # blocks 0-2 are the cached ones; 3 was A's unpublished partial block, freed and reused
    assert h.held(b).comp.blocks == [0, 1, 2, 3] and h.bm.comp.pool.num_evictions == 0
    h.run()


def test_vacant_ids_are_used_before_any_cached_block_is_evicted(harness):
    h = harness(spec_overrides={"sliding_window": 16})
    h.add(range(40), max_tokens=1)
    h.run()
    cached = h.bm.comp.pool.num_cached()
    assert cached == 2  # blocks 0 and 1 were full and published
    c = h.add(range(500, 540), max_tokens=1)
    h.step()
    assert set(h.held(c).comp.blocks).isdisjoint({0, 1}) and h.bm.comp.pool.num_cached() == cached
    assert h.bm.comp.pool.num_evictions == 0



def small_pool(num_chunks: int) -> BlockPool:
    from atom.config import Dsv4KvSpec, SchedulerConfig
    from atom.kv.kv_layout import KvLayout
    spec = Dsv4KvSpec(compress_ratios=(0, 4, 16), sliding_window=8, head_dim=32, rope_head_dim=8,
                      index_head_dim=16, row_format="fp32")
    lay = KvLayout.for_chunks(spec, num_chunks, SchedulerConfig(max_num_seqs=1, max_model_len=16))
    arena = UnifiedKvArena(lay)
    return BlockPool(COMPRESS, arena, PrefixIndex(), lay.max_compressed_pages)


def root_node(pool: BlockPool, block_hash: int):
    """A fresh one-block prefix (block 0) with this hash."""
    return pool.index.extend(-1, 0, [block_hash], [block_hash.to_bytes(8, "little")], 1)[0]


def test_cached_blocks_are_evicted_least_recently_released_first_preferring_emptier_chunks():
    pool = small_pool(4)
    k = pool.arena.pages_per_chunk(COMPRESS)
    ids, _ = pool.allocate(2 * k)  # fills chunks 0 and 1
    for i, bid in enumerate(ids):
        assert pool.publish(bid, root_node(pool, 1000 + i))
    for bid in ids[:k]:
        pool.release(bid)  # chunk 0 fully cached, released first (oldest)
    pool.release(ids[k])  # one cached block in chunk 1 (others still used)
    assert pool.evict_lru() and pool.num_evictions == 1
    assert not pool.is_cached(ids[0]) and pool.ref[ids[0]] == 0
    # reclaiming a chunk takes the chunk whose used pages are all cached: chunk 0, not chunk 1
    assert pool.reclaim_chunk()
    assert all(not pool.is_cached(b) for b in ids[:k]) and pool.is_cached(ids[k])
    assert pool.arena.num_free_chunks() == 3  # chunk 0 and the two never used
    pool.check_integrity()


def test_evicted_ids_are_clean_and_the_whole_capacity_can_be_drained_after_eviction():
    pool = small_pool(4)  # the smallest arena a request fits: 2 SWA chunks (one per live page), compressed, state
    n = pool.num_ids
    ids, _ = pool.allocate(n)
    for i, bid in enumerate(ids):
        pool.publish(bid, root_node(pool, i))
    for bid in ids:
        pool.release(bid)
    while pool.evict_lru():
        pass
    assert not any(pool.ref) and pool.node == [-1] * n and len(pool.index) == 0
    again, _ = pool.allocate(n)  # every id, the evicted ones included
    assert sorted(again) == list(range(n))
    pool.check_integrity({bid: 1 for bid in again})


@pytest.mark.parametrize("full_retain,expect_hit", [(False, 992), (True, 992)])
def test_a_1000_token_prompt_repeated_hits_only_fully_written_swa_blocks(harness, full_retain, expect_hit):
    h = harness(num_chunks=200, budget=256, max_model_len=2048, full_retain=full_retain,
                spec_overrides={"sliding_window": 16})
    prompt = [(7 * i) % 997 for i in range(1000)]
    h.add(prompt, max_tokens=1)
    h.run()
    b = h.add(prompt, max_tokens=3)
    h.run()  # the content model raises on any read of an unwritten or stale row
    assert b.stats.reused == expect_hit
    assert h.runner.content.reads > 300


def test_a_hit_at_a_boundary_whose_csa_state_was_never_captured_is_refused(harness):
    h = harness(spec_overrides={"sliding_window": 16})
    prompt = list(range(70))
    h.add(prompt, max_tokens=1)
    h.run()
    probe = h.add(prompt, max_tokens=1)
    match = h.bm.match_prefix(probe)
    assert match.blocks == 4
    tail = h.bm.published_block(SWA, probe, 3)
    h.bm.swa.pool.captured[tail] = False
    match = h.bm.match_prefix(probe)
    assert (match.window_bound, match.blocks) == (4, 0)
    h.run()
    assert probe.stats.lost_to_csa_state == 64 and probe.stats.reused == 0


def test_capture_destinations_are_the_blocks_own_backed_pages_and_restores_only_follow_hits(harness):
    h = harness(budget=20, spec_overrides={"sliding_window": 16})
    prompt = list(range(45))
    h.add(prompt, max_tokens=6)
    h.add(prompt, max_tokens=6)
    captures = restores = 0
    b = h.bm.block_size

    def check_captures_and_restores(batch):  # the runner ran the step; the scheduler has not advanced yet
        nonlocal captures, restores
        for item in batch.seqs:  # the runner captures a block's CSA state into its own SWA page
            held = h.held(h.sched.by_id[item.seq_id])
            for j in range(item.start_pos // b, (item.start_pos + item.num_tokens) // b):
                page = h.runner.tables[item.seq_id]["swa"][j]
                assert page >= 0 and page == held.swa.pages[j]
                captures += 1
            if item.restore_page >= 0:
                restores += 1
                assert item.state_reset and held.hit_blocks > 0

    h.observe(check_captures_and_restores)
    h.run()
    assert captures >= 4 and restores == 1


def test_each_decode_step_backs_publishes_and_releases_exactly_at_block_boundaries(harness):
    from atom.model_engine.sequence import Sequence
    from atom.sampling_params import SamplingParams

    h = harness(budget=64, spec_overrides={"sliding_window": 16})
    bm = h.bm
    B, W = bm.block_size, bm.swa.window
    seq = Sequence(list(range(1, 41)), SamplingParams(max_tokens=100), B)
    assert bm.admit(seq, 64) == 40
    seq.num_computed_tokens = 40
    seq.append_token(7)
    bm.after_step(seq)
    held = bm.holdings[seq.seq_id]
    for _ in range(3 * B):
        start = seq.num_computed_tokens
        before = (bm.arena.num_used(SWA), bm.arena.num_used(COMPRESS), len(held.comp.blocks))
        bm.grow(seq, 1)
        after = (bm.arena.num_used(SWA), bm.arena.num_used(COMPRESS), len(held.comp.blocks))
        assert (after != before) == (start % B == 0), f"step at {start}"  # new pages only for a new block
        seq.num_computed_tokens += 1
        seq.append_token(5)
        bm.after_step(seq)
        c = seq.num_computed_tokens
        assert held.published_upto == c // B, f"after {c} tokens"
        assert held.swa_released_upto == max(0, (c - W + 1) // B), f"after {c} tokens"
        bm.check_integrity([seq])
