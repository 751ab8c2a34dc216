"""``SlidingWindowPool.bounded_hit`` (tried from the top boundary down) gives the boundaries a
forward pass over the chain defines, on random chains of cached and missing window blocks."""

import random

from atom.bench.control_plane_ops import Workload, _block_manager


def _forward(swa_at, limit, tail, captured, needs_state, follows, tokens, b_size):
    window_only = with_state = run = 0
    for b in range(1, limit + 1):
        bid = swa_at[b - 1]
        run = run + 1 if bid >= 0 else 0
        if run >= min(tail, b) and (follows is None or follows[bid] == tokens[b * b_size]):
            window_only = b
            if not needs_state or captured[bid]:
                with_state = b
    return window_only, (with_state if needs_state else window_only)


def test_bounded_hit_finds_the_boundaries_a_forward_pass_finds():
    swa = _block_manager(Workload("t", 2, 4096), 128, 1).swa
    b_size, rng = swa.block_size, random.Random(7)
    for trial in range(600):
        swa.tail_blocks, swa.needs_state, swa.mtp_rows = rng.randint(1, 3), rng.random() < 0.5, rng.random() < 0.3
        limit = rng.randint(0, 12)
        index = swa.index
        chain = index.extend(-1, 0, [trial * 100 + j for j in range(limit)], [b""] * limit, limit)
        swa_at = [j if rng.random() < 0.75 else -1 for j in range(limit)]
        for node, bid in zip(chain, swa_at):
            index.swa[node] = bid
        for j in range(limit):
            swa.pool.captured[j] = rng.random() < 0.6
            swa.next_token[j] = rng.randint(1, 3)
        tokens = [rng.randint(1, 3) for _ in range((limit + 1) * b_size + 1)]
        follows = swa.next_token if swa.mtp_rows else None
        expect = _forward(swa_at, limit, swa.tail_blocks, swa.pool.captured, swa.needs_state, follows, tokens, b_size)
        assert swa.bounded_hit(chain, limit, tokens) == expect, f"trial {trial}"
