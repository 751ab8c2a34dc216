"""``pop_many(n)`` takes exactly the pages ``n`` calls of ``pop`` would, and leaves the same state."""

import random

from atom.kv.chunk_arena import ChunkArena, ChunkBackedFreeList


def _state(fl: ChunkBackedFreeList) -> tuple:
    return (sorted((c, sorted(p)) for c, p in fl._free_pages.items()), [list(b) for b in fl._by_used],
            fl.num_used(), fl.arena.num_free())


def test_pop_many_takes_the_pages_repeated_pop_takes_over_random_frees_and_sizes():
    for ppc in (1, 3, 25):
        rng = random.Random(ppc)
        one, many = (ChunkBackedFreeList(ChunkArena(64), ppc, "t") for _ in range(2))
        held: list[int] = []
        for _ in range(300):
            if held and rng.random() < 0.45:
                victims = rng.sample(held, rng.randint(1, min(len(held), 7)))
                for page in victims:
                    held.remove(page)
                one.free_many(victims)
                many.free_many(victims)
            else:
                n = rng.randint(1, 2 * ppc + 3)
                if n > many.available():
                    continue
                expect = [one.pop() for _ in range(n)]
                assert many.pop_many(n) == expect
                held += expect
            assert _state(one) == _state(many)
        one.check_integrity()
        many.check_integrity()
