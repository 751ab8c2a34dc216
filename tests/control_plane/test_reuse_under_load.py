"""The SWA hit rate of a hot shared prefix does not collapse as arena occupancy rises
(vLLM #48435 reported SWA hit rates collapsing at 25% occupancy)."""

import pytest

from atom.model_engine.sequence import SequenceStatus


def occupancy(h) -> float:
    arena = h.bm.arena
    return (arena.owned_chunks("swa") + arena.owned_chunks("compress")) / arena.layout.num_chunks


@pytest.mark.parametrize("target", [0.25, 0.5, pytest.param(0.9, marks=pytest.mark.slow)])
def test_a_repeated_prefix_keeps_hitting_at_25_50_and_90_percent_occupancy(harness, target):
    h = harness(num_chunks=60, budget=256, max_seqs=16, max_model_len=1024, full_retain=True)
    holders = 0
    while occupancy(h) < target:  # long-running requests that hold memory and keep growing
        if not h.sched.waiting and len(h.sched.running) < 16:
            h.add([(31 * holders + j) % 997 for j in range(40)], max_tokens=900)
            holders += 1
        h.step()  # (one step moves the occupancy by a few chunks at most)
    assert target <= occupancy(h) < target + 0.1
    shared = list(range(500, 564))
    reqs = []
    for r in range(12):
        seq = h.add(shared + [r, r + 1, r + 2], max_tokens=3)
        while seq.status is not SequenceStatus.FINISHED_LENGTH:
            h.step()
        reqs.append(seq)
    hit_rate = sum(s.stats.reused for s in reqs[1:]) / (len(shared) * (len(reqs) - 1))
    assert hit_rate >= 0.9
