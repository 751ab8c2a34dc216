"""A refused admission changes nothing: the cache's LRU order, the retention pins and their order,
every block's references and age, the prefix index and the arena are exactly as before."""

from atom.kv.block_manager import BlockManager


def unique(n, salt):
    return [(salt * 131 + 7 * i) % 997 + 1 for i in range(n)]


def full_state(bm: BlockManager) -> dict:
    """Everything the block manager's policies read, in order where order matters."""
    out = {"pins": bm.swa.pinned_ids(), "holdings": sorted(bm.holdings), "updates": list(bm.updates),
           "index": sorted((ix.block_hash[n], ix.refs[n], ix.comp[n], ix.swa[n]) for ix in [bm.index] for n in ix.live()),
           "counters": bm.counters, "frontier": dict(bm._frontier),
           "arena": [(o, bm.arena.num_used(o), bm.arena.owned_chunks(o)) for o in ("compress", "swa", "state")]}
    for name, pool in (("comp", bm.comp.pool), ("swa", bm.swa.pool)):
        out[name] = {"lru": list(pool._cached), "ref": list(pool.ref), "pages": list(pool.pages),
                     "cached_at": list(pool.cached_at), "clock": pool._clock,
                     "per_chunk": pool.cached_pages_per_chunk(), "vacant": list(pool._vacant),
                     "evictions": pool.num_evictions, "evicted": list(pool.evicted_hashes)}
    return out


def refused_hit(harness):
    """A 100-token prompt leaves its prefix cached with pinned checkpoints (every 32 tokens, full
    retain, an 8-chunk arena, 16-token chunks); a running request with the same 96-token prefix then
    fills the arena. Returns the harness and a second request with that prefix, not yet admitted."""
    h = harness(num_chunks=8, full_retain=True, interval=32, budget=16, max_model_len=512, max_seqs=8,
                pin_fraction=1.0)
    prompt = unique(100, 1)
    h.add(prompt, max_tokens=2)
    h.run()
    h.add(prompt[:96] + unique(100, 2), max_tokens=8)
    for _ in range(8):
        h.step()
    late = h.add(prompt[:96] + unique(100, 3), max_tokens=2)
    h.sched.waiting.remove(late)  # admitted by hand below
    return h, late


def test_a_refused_admission_that_would_claim_a_pinned_block_leaves_the_pins_and_lru_unchanged(harness):
    # the late request's hit window is the oldest pin: claiming it used to move it to the newest end of
    # the pins and the cached blocks it claimed to the newest end of the LRU, and the release kept them there
    h, late = refused_hit(harness)
    bm = h.bm
    match = bm.match_prefix(late)
    hit_window = bm.published_block("swa", late, match.blocks - 1)
    assert match.blocks == 6 and bm.swa.pinned_ids() == [hit_window, 2, 1, 3]
    assert [s.num_computed_tokens for s in h.sched.running] == [197]  # its prompt ran, it decodes
    before = full_state(bm)
    assert bm.admit(late, 32) == 0
    assert full_state(bm) == before
    assert late.num_computed_tokens == late.num_cached_tokens == 0
    bm.check_integrity(h.sched.running)


def test_the_refused_request_is_admitted_with_its_hit_once_the_running_one_ends(harness):
    h, late = refused_hit(harness)
    h.run()
    pins = h.bm.swa.pinned_ids()
    # one block: 32 tokens would fit only by releasing a pin, so the first chunk is the longest that
    # fits within the pins (the same rule as a running request's chunks)
    assert h.bm.admit(late, 32) == 16 and late.num_cached_tokens == 96
    assert set(pins) <= set(h.bm.swa.pinned_ids())
    h.sched.running.append(late)
    h.bm.check_integrity(h.sched.running)
