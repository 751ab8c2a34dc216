"""A prefill chunk never makes its room by touching a retention pin when a shorter chunk would not:
a large token budget keeps the pinned checkpoints (and the compressed prefix they need) that a
small budget keeps."""

def unique(n, salt):
    return [(salt * 131 + 7 * i) % 997 + 1 for i in range(n)]


HOT = unique(64, 1)


def long_prompt_after_a_hot_prefix(harness, budget: int):
    """A 67-token request leaves the 64-token prefix ``HOT`` cached with its checkpoints pinned (every
    32 tokens, full retain, a 14-chunk arena); then a 200-token prompt runs. Returns the harness,
    the pins before the long prompt, and its chunk sizes."""
    h = harness(num_chunks=14, full_retain=True, interval=32, budget=budget, max_model_len=512, pin_fraction=1.0)
    h.add(HOT + [5, 6, 7], max_tokens=2)
    h.run()
    pins = h.bm.swa.pinned_ids()
    h.add(unique(200, 2), max_tokens=2)
    chunks = []
    while h.sched.has_unfinished():
        chunks += [s.num_tokens for s in h.step().batch.seqs]
    return h, pins, chunks


def test_a_large_budget_keeps_the_pinned_hot_prefix_that_a_small_budget_keeps(harness):
    for budget, want_chunks in ((64, [64, 64, 64, 8, 1]), (512, [1, 143, 56, 1])):
        h, pins, chunks = long_prompt_after_a_hot_prefix(harness, budget)
        # 512: the 200-token first chunk cannot fit even after evicting everything, so the idle arena
        # admits 1 token; then the longest chunk that fits beside the checkpoints and the compressed
        # blocks they need (to the end of block 8: 143 tokens), then the rest. It used to run 1 + 15 +
        # 16 + 16 tokens, then take the remaining 152 in one chunk that released the pins and evicted
        # the hot prefix's compressed blocks
        assert chunks == want_chunks, budget
        assert len(pins) == 2 and set(pins) <= set(h.bm.swa.pinned_ids()), budget
        assert h.bm.comp.pool.num_evictions == 0, budget
        again = h.add(HOT + [9, 9, 9], max_tokens=2)
        h.run()
        assert again.num_cached_tokens == 64, budget
        h.assert_all_memory_returned()


def test_without_pins_a_large_budget_takes_the_whole_prompt_in_one_chunk(harness):
    h = harness(num_chunks=40, full_retain=True, budget=512, max_model_len=512)
    h.add(unique(200, 2), max_tokens=2)
    assert [s.num_tokens for s in h.step().batch.seqs] == [200]
