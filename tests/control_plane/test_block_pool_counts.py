"""The block pool's per-chunk cached page counts, kept up to date as blocks are cached, claimed and
evicted, equal a recount after every operation of a random run, and the eviction choices made
from them are the ones a recount gives (same chunk, same victims, same order)."""

import random

import pytest

from atom.config import CacheConfig, Dsv4KvSpec, SchedulerConfig
from atom.kv.block_pool import BlockPool
from atom.kv.kv_layout import KvLayout
from atom.kv.prefix_index import PrefixIndex
from atom.kv.page_map import COMPRESS, SWA
from atom.kv.unified_kv_arena import UnifiedKvArena


def pool_of(owner: str, num_chunks: int, chunk_pages: int) -> BlockPool:
    spec = Dsv4KvSpec(compress_ratios=(0, 4, 16), sliding_window=8, head_dim=32, rope_head_dim=8,
                      index_head_dim=16, row_format="fp32")
    lay = KvLayout.for_chunks(spec, num_chunks, SchedulerConfig(max_num_seqs=1, max_model_len=16),
                              CacheConfig(chunk_pages=chunk_pages))
    num_ids = lay.max_swa_pages if owner == SWA else lay.max_compressed_pages
    return BlockPool(owner, UnifiedKvArena(lay), PrefixIndex(), num_ids)


class Model:
    """What the pool should hold: references per id, and the cached ids least recently released first."""

    def __init__(self, pool: BlockPool) -> None:
        self.pool, self.refs, self.lru, self.published, self.hashes = pool, {}, [], set(), 0
        self.owner = pool.owner
        self.ppc = pool.arena.pages_per_chunk(self.owner)

    def chunk(self, bid: int) -> int:
        return self.pool.page(bid) // self.ppc

    def recount(self) -> dict[int, int]:
        out: dict[int, int] = {}
        for bid in self.lru:
            out[self.chunk(bid)] = out.get(self.chunk(bid), 0) + 1
        return out

    def expected_reclaim(self) -> list[int]:
        """The chunk of the least recently released cached block whose chunk holds only cached pages
        in use: its cached blocks in LRU order (empty when no chunk qualifies)."""
        counts, used = self.recount(), self.pool.arena.chunk_pages_used
        for bid in self.lru:
            c = self.chunk(bid)
            if counts[c] == used(self.owner, c):
                return [b for b in self.lru if self.chunk(b) == c]
        return []

    def expected_kept(self, releasable: list[int]) -> tuple[int, int]:
        counts, arena = self.recount(), self.pool.arena
        for bid in releasable:
            counts[self.chunk(bid)] = counts.get(self.chunk(bid), 0) + 1
        drained = sum(n == arena.chunk_pages_used(self.owner, c) for c, n in counts.items())
        return arena.num_used(self.owner) - len(self.lru) - len(releasable), arena.owned_chunks(self.owner) - drained

    # ---- operations ---------------------------------------------------------------------------
    def allocate(self, rng: random.Random) -> None:
        n = rng.randint(1, 3)
        vacant = self.pool.num_ids - self.pool.num_used() - self.pool.num_cached()
        if not self.pool.arena.can_alloc(**{self.owner: n}) or vacant < n:
            return
        ids, _ = self.pool.allocate(n)
        for bid in ids:
            self.refs[bid] = 1
            if rng.random() < 0.8:
                self.hashes += 1
                node = self.pool.index.extend(-1, 0, [self.hashes], [self.hashes.to_bytes(8, "little")], 1)[0]
                assert self.pool.publish(bid, node)
                self.published.add(bid)

    def release(self, rng: random.Random) -> None:
        held = sorted(self.refs)
        if not held:
            return
        bids = rng.sample(held, rng.randint(1, min(3, len(held))))
        keep = rng.random() < 0.9
        self.pool.release_many(bids, keep)
        for bid in bids:
            self.refs[bid] -= 1
            if not self.refs[bid]:
                del self.refs[bid]
                if keep and bid in self.published:
                    self.lru.append(bid)
                else:
                    self.published.discard(bid)

    def claim(self, rng: random.Random) -> None:
        choices = self.lru + sorted(self.refs)
        if choices:
            bid = rng.choice(choices)
            self.pool.claim(bid)
            if bid in self.lru:
                self.lru.remove(bid)
            self.refs[bid] = self.refs.get(bid, 0) + 1

    def evict_lru(self, rng: random.Random) -> None:
        if not self.lru:
            assert not self.pool.evict_lru()
            return
        oldest = self.lru[:8]  # the pool's LRU window
        assert self.pool.evict_lru()
        gone = [b for b in self.lru if not self.pool.is_cached(b)]
        assert len(gone) == 1 and gone[0] in oldest
        self.forget(gone)

    def reclaim(self, rng: random.Random) -> None:
        expected = self.expected_reclaim()
        hashes, evictions = [self.pool.index.block_hash[self.pool.node[b]] for b in expected], self.pool.num_evictions
        assert self.pool.reclaim_chunk() == bool(expected)
        assert self.pool.num_evictions == evictions + len(expected)
        assert list(self.pool.evicted_hashes)[len(self.pool.evicted_hashes) - len(expected):] == hashes  # in LRU order
        self.forget(expected)

    def kept(self, rng: random.Random) -> None:
        single = sorted(bid for bid, n in self.refs.items() if n == 1)  # as if held by a pin alone
        releasable = rng.sample(single, rng.randint(0, len(single)))
        assert self.pool.kept_after_eviction(releasable) == self.expected_kept(releasable)

    def forget(self, bids: list[int]) -> None:
        for bid in bids:
            self.lru.remove(bid)
            self.published.discard(bid)


@pytest.mark.parametrize("owner,chunk_pages", [(SWA, 2), (SWA, 3), (COMPRESS, 1)])
@pytest.mark.parametrize("seed", range(2))
def test_the_per_chunk_cached_counts_equal_a_recount_through_random_operations(owner, chunk_pages, seed):
    rng = random.Random(seed)
    pool = pool_of(owner, 8, chunk_pages)
    model = Model(pool)
    ops = [model.allocate] * 3 + [model.release] * 3 + [model.claim, model.evict_lru, model.reclaim, model.kept]
    reclaimed = 0
    for _ in range(600):
        op = rng.choice(ops)
        reclaimed += op == model.reclaim and bool(model.expected_reclaim())
        op(rng)
        assert [b for b in model.lru if pool.is_cached(b)] == model.lru and pool.num_cached() == len(model.lru)
        pool.check_integrity(model.refs)
    assert reclaimed > 0 and pool.num_evictions > reclaimed


@pytest.mark.parametrize("owner,chunk_pages", [(SWA, 2), (COMPRESS, 1)])
def test_the_counts_stay_right_when_several_releases_go_uncounted_before_a_claim_or_eviction(owner, chunk_pages):
    rng = random.Random(7)
    pool = pool_of(owner, 8, chunk_pages)
    model = Model(pool)
    ops = [model.allocate] * 3 + [model.release] * 4 + [model.claim, model.evict_lru]
    for step in range(600):
        rng.choice(ops)(rng)
        if step % 9 == 8:  # (an integrity check reads the counts: most operations find some uncounted)
            assert pool.cached_pages_per_chunk() == model.recount()
            pool.check_integrity(model.refs)
    assert pool.num_evictions > 0


def test_a_release_dates_the_blocks_it_caches_in_the_order_they_were_released():
    pool = pool_of(SWA, 8, 2)
    pool.unlock_tokens = lambda bid: 1
    ids, _ = pool.allocate(3)
    for k, bid in enumerate(ids):
        node = pool.index.extend(-1, 0, [k + 1], [(k + 1).to_bytes(8, "little")], 1)[0]
        assert pool.publish(bid, node)
    pool.release_many([ids[2], ids[0], ids[1]])
    assert [pool.cached_at[b] for b in (ids[2], ids[0], ids[1])] == [0, 1, 2]
    assert list(pool._cached) == [ids[2], ids[0], ids[1]]
