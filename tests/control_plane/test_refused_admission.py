"""A refused admission changes nothing: the cache's LRU order, the retention pins and their order,
every block's references and age, the prefix index and the arena are exactly as before."""

from atom.model_engine.block_manager import BlockManager


def unique(n, salt):
    return [(salt * 131 + 7 * i) % 997 + 1 for i in range(n)]


def full_state(bm: BlockManager) -> dict:
    """Everything the block manager's policies read, in order where order matters."""
    out = {"pins": bm.swa.pinned_ids(), "holdings": sorted(bm.holdings), "updates": list(bm.updates),
           "index": sorted((n.block_hash, n.refs, n.comp, n.swa) for n in bm.index._nodes.values()),
           "counters": bm.counters, "frontier": dict(bm._frontier),
           "arena": [(o, bm.arena.num_used(o), bm.arena.owned_chunks(o)) for o in ("compress", "swa", "state")]}
    for name, pool in (("comp", bm.comp.pool), ("swa", bm.swa.pool)):
        out[name] = {"lru": list(pool._cached), "ref": list(pool.ref), "pages": list(pool.pages),
                     "cached_at": list(pool.cached_at), "clock": pool._clock,
                     "per_chunk": dict(pool._cached_in_chunk), "vacant": list(pool._vacant),
                     "evictions": pool.num_evictions, "evicted": list(pool.evicted_hashes)}
    return out


def refused_hit(harness, running_len: int):
    """A request whose prompt hits a cached, pinned prefix but whose first chunk cannot fit beside a
    running request, in a 9-chunk arena with full retain and retention pins every 32 tokens."""
    h = harness(num_chunks=9, full_retain=True, interval=32, budget=256, max_model_len=512)
    prompt = unique(100, 1)
    h.add(prompt, max_tokens=2)
    h.run()
    h.add(unique(running_len, 2), max_tokens=60)
    h.step()
    late = h.add(prompt[:96] + unique(100, 3), max_tokens=2)
    h.sched.waiting.remove(late)  # admitted by hand below
    return h, late


def test_a_refused_admission_that_would_claim_a_pinned_block_leaves_the_pins_and_lru_unchanged(harness):
    h, late = refused_hit(harness, running_len=40)
    bm = h.bm
    match = bm.match_prefix(late)
    hit_window = bm.published_block("swa", late, match.blocks - 1)
    assert match.blocks == 6 and hit_window in bm.swa.pinned_ids() and bm.swa.pinned_ids() != [hit_window]
    assert list(bm.comp.pool._cached) == [5, 4, 3, 2, 1, 0]  # the hit claims all of them
    before = full_state(bm)
    assert bm.admit(late, 256) == 0
    assert full_state(bm) == before
    assert late.num_computed_tokens == late.num_cached_tokens == 0
    bm.check_integrity(h.sched.running)


def test_a_refused_admission_that_would_claim_cached_window_blocks_leaves_the_lru_unchanged(harness):
    h, late = refused_hit(harness, running_len=80)
    bm = h.bm
    match = bm.match_prefix(late)
    hit_window = bm.published_block("swa", late, match.blocks - 1)
    cached = list(bm.swa.pool._cached)
    assert match.blocks == 4 and hit_window in cached and cached[-1] != hit_window
    before = full_state(bm)
    assert bm.admit(late, 256) == 0
    assert full_state(bm) == before
    bm.check_integrity(h.sched.running)


def test_the_refused_request_is_admitted_with_its_hit_once_the_running_one_ends(harness):
    h, late = refused_hit(harness, running_len=40)
    h.run()
    assert h.bm.admit(late, 32) == 32 and late.num_cached_tokens == 96
    h.sched.running.append(late)
    h.bm.check_integrity(h.sched.running)
