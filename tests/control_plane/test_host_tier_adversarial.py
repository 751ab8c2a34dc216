"""The host tier loses nothing and serves nothing stale: random admissions, aborts and evictions on both
tiers, a host pool that fills, and injected hash collisions, with every row a step reads (restored ones
included) checked against what a cold run wrote (:class:`KvContentModel` follows the copy orders) and
``check_integrity`` (both tiers) after every step."""

import random
import zlib
from array import array

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize, rule

import atom.model_engine.sequence as sequence_module
from atom.config import CacheConfig, Dsv4KvSpec, SchedulerConfig
from atom.kv.block_manager import BlockManager
from atom.kv.chunk_arena import ArenaEmpty
from atom.kv.kv_layout import KvLayout
from atom.kv.page_map import COMPRESS, SWA
from atom.model_engine.llm_engine import LLMEngine
from atom.model_engine.scheduler import Scheduler
from atom.model_engine.sequence import SequenceStatus
from atom.testing.kv_content_model import KvContentModel
from support.control_plane import TINY, Harness, ObservedRunner
from support.traffic_rules import min_chunks, traffic_rules

MAX_LEN = 256
PREFIXES = [list(range(100, 180)), list(range(300, 348)), [5] * 40]


def host_harness(num_chunks: int, host_chunks: int, *, chunk_pages: int = 1, budget: int = 32, max_seqs: int = 3,
                 full_retain: bool = False, window: int = 8, overlap: bool = True, policy: str = "back",
                 through_hits: int = 2) -> Harness:
    """A content-checked harness whose block manager has a host tier of ``host_chunks`` arena chunks."""
    spec = Dsv4KvSpec(**{**TINY, "sliding_window": window})
    limits = SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=max_seqs, max_model_len=MAX_LEN,
                             overlap=overlap)
    layout = KvLayout.for_chunks(spec, num_chunks, limits, CacheConfig(chunk_pages=chunk_pages))
    cache = CacheConfig(chunk_pages=chunk_pages, swa_full_retain=full_retain,
                        host_kv_cache_bytes=host_chunks * layout.chunk_bytes, host_kv_write_policy=policy,
                        host_kv_write_through_hits=through_hits)
    sched = Scheduler(limits, BlockManager(layout, cache), eos_token_id=None)
    content = KvContentModel.for_spec(spec, lambda sid: sched.by_id[sid].token_ids)
    return Harness(LLMEngine(sched, ObservedRunner(vocab_size=997, content=content)))


def truncated_hashes(token_ids, block_size, num_blocks, hashes, keys):
    """A 3-bit hash that also forgets the prefix: blocks collide under any prefix and with each other."""
    for j in range(len(hashes), num_blocks):
        key = array("q", token_ids[j * block_size:(j + 1) * block_size]).tobytes()
        hashes.append(zlib.crc32(key) & 7)  # (crc32: the same in every process, unlike hash())
        keys.append(key)


class HostTrafficMachine(traffic_rules(PREFIXES, MAX_LEN, max_new_tokens=16, long_from=100)):
    @initialize(extra=st.integers(0, 6), host_chunks=st.integers(1, 12), budget=st.sampled_from([7, 16, 40]),
                window=st.sampled_from([8, 16, 49]), chunk_pages=st.sampled_from([1, 2]), full_retain=st.booleans(),
                collide=st.booleans(), policy=st.sampled_from(["back", "through"]), through_hits=st.integers(1, 3))
    def setup(self, extra, host_chunks, budget, window, chunk_pages, full_retain, collide, policy, through_hits):
        self._restore_hash = None
        if collide:
            self._restore_hash = sequence_module.chain_hashes
            sequence_module.chain_hashes = truncated_hashes
        self.h = host_harness(min_chunks(window, chunk_pages, MAX_LEN) + extra, host_chunks, chunk_pages=chunk_pages,
                              budget=budget, full_retain=full_retain, window=window, policy=policy,
                              through_hits=through_hits)
        self.live = []

    @rule(owner=st.sampled_from([SWA, COMPRESS]), n=st.integers(1, 8))
    def evict_device(self, owner, n):
        """The device evicts cached blocks (each written back to the host tier when it has room)."""
        pool = self.h.bm.swa.pool if owner == SWA else self.h.bm.comp.pool
        for _ in range(n):
            pool.evict_lru()

    @rule(owner=st.sampled_from([SWA, COMPRESS]), n=st.integers(1, 8))
    def evict_host(self, owner, n):
        host = self.h.bm.host
        for _ in range(n):
            host._evict_one(owner)

    def teardown(self):
        try:
            if hasattr(self, "h"):
                self.h.run()
                dropped = [s for s in self.live if s.status is SequenceStatus.FINISHED_ABORTED and s.error]
                assert not dropped, f"requests within the model length were dropped: {[s.error for s in dropped]}"
                self.h.assert_all_memory_returned()
                assert self.h.bm.host.num_copies(SWA) == self.h.bm.host.num_copies(COMPRESS) == 0
        finally:
            if self._restore_hash is not None:
                sequence_module.chain_hashes = self._restore_hash


TestHostTraffic = HostTrafficMachine.TestCase
TestHostTraffic.settings = settings(max_examples=40, stateful_step_count=30, deadline=None,
                                    suppress_health_check=[HealthCheck.too_slow])


def run_alone(h: Harness, tokens, max_tokens=2):
    seq = h.add(tokens, max_tokens=max_tokens)
    h.run()
    return seq


def flood(h: Harness, n: int, length: int = 200):
    for k in range(n):
        run_alone(h, [(17 * i + 101 * k + 3) % 997 for i in range(length)], max_tokens=1)


PROMPT = [(13 * i + 5) % 997 for i in range(200)]


def test_a_prompt_whose_prefix_the_device_evicted_is_served_from_the_host_tier():
    h = host_harness(12, 40)
    first = run_alone(h, PROMPT, max_tokens=3)
    flood(h, 6)
    assert h.bm.match_prefix(h.add(PROMPT, max_tokens=3)).from_host > 0
    again = h.sched.waiting[-1]
    h.run()  # every restored row is read and checked by the content model
    assert again.stats.reused == 192 and again.stats.reused_from_host == 192
    assert again.output_token_ids == [h.runner.token_for(again.seq_id, p) for p in range(200, 203)]
    assert first.stats.reused_from_host == 0
    stats = h.bm.host.snapshot()
    assert stats.host_hit_tokens == 192 and stats.host_bytes_in > 0 and stats.host_bytes_out >= stats.host_bytes_in
    assert h.runner.content.pages_copied > 0
    h.assert_all_memory_returned()


def test_without_a_host_tier_the_same_traffic_recomputes_the_prompt():
    h = host_harness(12, 0)
    assert h.bm.host is None
    run_alone(h, PROMPT, max_tokens=3)
    flood(h, 6)
    again = run_alone(h, PROMPT, max_tokens=3)
    assert again.stats.reused == 0


def test_a_host_pool_of_one_chunk_keeps_only_the_latest_copies_and_stays_consistent():
    h = host_harness(12, 1)
    run_alone(h, PROMPT, max_tokens=3)
    flood(h, 6)
    host = h.bm.host
    assert 0 < host.num_copies(COMPRESS) + host.num_copies(SWA)
    assert host.snapshot().host_pool_bytes_used == host.snapshot().host_pool_bytes_total == h.bm.host.chunk_bytes
    again = run_alone(h, PROMPT, max_tokens=3)
    assert again.stats.reused_from_host == 0  # the prompt's copies were pushed out by the flood's
    h.assert_all_memory_returned()


def test_a_host_copy_under_another_prefix_is_never_served(monkeypatch):
    monkeypatch.setattr(sequence_module, "chain_hashes", truncated_hashes)
    h = host_harness(12, 40)
    x_other, x, rest = [7] * 16, [8] * 16, [(3 * i) % 997 for i in range(64)]
    other = run_alone(h, x_other + rest + [1], max_tokens=1)  # publishes X', Y, Z, ...
    h.bm.drop_cache()  # ... which the arena evicts to the host tier
    # publishes X and its own Y, Z, ...: their hashes equal those under X', but each node is its parent's
    run_alone(h, x + rest + [2], max_tokens=1)
    h.bm.drop_cache()
    d = h.add(x + rest + [3], max_tokens=1)
    index = h.bm.index
    mine, theirs = (index.chain(s.hashes_upto(5), s.block_keys, 5) for s in (d, other))
    assert len(mine) == len(theirs) == 5 and set(mine).isdisjoint(theirs)
    assert [index.block_hash[n] for n in mine] == d.hashes_upto(5)
    assert d.hashes_upto(5)[1:] == other.hashes_upto(5)[1:]  # every block after the first collides
    assert all(index.host_comp[n] >= 0 for n in mine) and h.bm.match_prefix(d).from_host == 5
    h.run()  # the content model fails any read of a row computed under X'
    assert d.stats.reused_from_host == 80 and d.status is SequenceStatus.FINISHED_LENGTH
    h.assert_all_memory_returned()


@pytest.mark.parametrize("overlap", [True, False])
def test_a_request_preempted_while_its_host_load_is_in_flight_is_restored_again_exactly(overlap):
    h = host_harness(14, 40, budget=16, max_seqs=2, overlap=overlap)
    run_alone(h, PROMPT, max_tokens=3)
    flood(h, 6)
    older = h.add([(29 * i + 1) % 997 for i in range(120)], max_tokens=30)
    h.step()
    hit = h.add(PROMPT, max_tokens=40)
    loads, fail_once = [], []
    real_grow = h.bm.grow

    def grow(seq, num_new, **kw):  # the older request's next growth finds no room: the younger one goes
        if seq is older and fail_once:
            fail_once.clear()
            raise ArenaEmpty("injected")
        return real_grow(seq, num_new, **kw)

    h.bm.grow = grow

    def on_batch(batch):
        if any(o.src_pages for o in batch.host_loads):
            loads.append(batch.step)
            fail_once.append(True)  # the schedule after this batch (overlap: while it runs) preempts
    h.observe(on_batch)
    h.run()
    assert hit.stats.reused_from_host == 192 and hit.num_preemptions == 1 and len(loads) >= 1
    assert hit.status is SequenceStatus.FINISHED_LENGTH and older.status is SequenceStatus.FINISHED_LENGTH
    assert hit.output_token_ids == [h.runner.token_for(hit.seq_id, p) for p in range(200, 240)]
    h.assert_all_memory_returned()


def test_write_through_copies_a_block_on_its_nth_hit_so_its_eviction_writes_nothing():
    h = host_harness(40, 40, policy="through", through_hits=2)
    run_alone(h, PROMPT, max_tokens=1)
    run_alone(h, PROMPT, max_tokens=1)  # first hit: nothing copied yet
    assert h.bm.host.snapshot().host_bytes_out == 0
    run_alone(h, PROMPT, max_tokens=1)  # second hit: the hit's blocks are copied while still on the device
    copied = h.bm.host.snapshot().host_bytes_out
    assert h.bm.host.num_copies(COMPRESS) == 12 and h.bm.host.num_copies(SWA) == 1 and copied > 0
    assert copied == 12 * h.bm.host.page_bytes[COMPRESS] + h.bm.host.page_bytes[SWA]
    h.bm.drop_cache()  # the arena evicts everything: each block is written once, the copied ones not again
    host = h.bm.host
    assert host.snapshot().host_bytes_out == sum(host.page_bytes[o] * host.num_copies(o) for o in (SWA, COMPRESS))
    again = run_alone(h, PROMPT, max_tokens=1)
    assert again.stats.reused == 192 and again.stats.reused_from_host == 192
    h.assert_all_memory_returned()


def skewed_reuse(policy: str) -> Harness:
    """Skewed reuse of 8 documents (Pareto) through an arena 4 chunks over the minimum."""
    rnd = random.Random(1)
    h = host_harness(min_chunks(8, 1, MAX_LEN) + 4, 40, policy=policy, max_seqs=3)
    docs = [[(97 * d + 13 * i) % 997 for i in range(160)] for d in range(8)]
    for r in range(120):
        doc = docs[min(int(rnd.paretovariate(1.2)) - 1, 7)]
        h.add(doc + [rnd.randrange(997) for _ in range(rnd.randrange(1, 30))], max_tokens=4)
        if r % 3 == 2:
            h.run()
    h.run()
    return h


def test_host_hits_into_a_crowded_arena_back_their_first_chunk_with_the_restored_pages():
    """Restoring a hit's pages, then backing its first chunk, once fragmented chunks so that the first
    chunk no longer fitted (``ArenaEmpty`` out of ``admit``)."""
    h = skewed_reuse("back")
    assert h.bm.counters.reused_from_host > 0
    h.assert_all_memory_returned()


def test_write_through_serves_and_moves_what_write_back_does_while_the_host_pool_has_room():
    """The tier is inclusive: write-through copies a block earlier, not more often, so with room on the
    host both policies serve the same tokens and move the same bytes."""
    back, through = skewed_reuse("back"), skewed_reuse("through")
    stats = [(h.bm.counters.reused, h.bm.counters.reused_from_host, h.bm.host.stats.host_bytes_out,
              h.bm.host.stats.host_bytes_in) for h in (back, through)]
    assert stats[0] == stats[1] == (16784, 9744, 2353664, 2158592)


SHARED = [(53 * i + 7) % 500 + 1 for i in range(48)]  # three blocks of 16


def hit_from_host(first: list[int], second: list[int], mtp_rows: bool) -> tuple[int, int]:
    """(tokens, from the host) the second prompt reuses after the first ran and the arena evicted it all."""
    spec = Dsv4KvSpec(**TINY)
    limits = SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=4, max_model_len=256)
    layout = KvLayout.for_chunks(spec, 40, limits, CacheConfig(chunk_pages=1))
    cache = CacheConfig(chunk_pages=1, swa_full_retain=True, host_kv_cache_bytes=40 * layout.chunk_bytes)
    sched = Scheduler(limits, BlockManager(layout, cache, mtp_rows=mtp_rows), None)
    h = Harness(LLMEngine(sched, ObservedRunner(vocab_size=997, content=KvContentModel.for_spec(
        spec, lambda sid: sched.by_id[sid].token_ids))))
    run_alone(h, first)
    h.bm.drop_cache()
    seq = run_alone(h, second)
    return seq.num_cached_tokens, seq.stats.reused_from_host


def test_the_mtp_row_rule_holds_for_blocks_restored_from_the_host():
    first = SHARED + [1, 2, 3]
    assert hit_from_host(first, SHARED + [4, 5, 6], mtp_rows=False) == (48, 48)
    assert hit_from_host(first, SHARED + [4, 5, 6], mtp_rows=True) == (32, 32)  # block 2's MTP row saw token 1
    assert hit_from_host(first, SHARED + [1, 2, 9], mtp_rows=True) == (48, 48)
