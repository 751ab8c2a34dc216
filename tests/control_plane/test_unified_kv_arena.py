"""UnifiedKvArena: all-or-nothing allocation, lending between the three owners, and no aliasing, ever."""

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from atom.config import CacheConfig, Dsv4KvSpec, SchedulerConfig
from atom.kv.chunk_arena import ArenaEmpty, ArenaError
from atom.kv.kv_layout import KvLayout
from atom.kv.page_map import COMPRESS, OWNERS, STATE, SWA
from atom.kv.unified_kv_arena import UnifiedKvArena


def tiny_layout(num_chunks: int, chunk_pages: int = 1):
    spec = Dsv4KvSpec(compress_ratios=(0, 4, 16, 4, 16, 4, 0), sliding_window=8, head_dim=32, rope_head_dim=8,
                      index_head_dim=16, row_format="fp32", num_mtp_layers=1)
    lay = KvLayout.for_chunks(spec, num_chunks, SchedulerConfig(max_num_seqs=1, max_model_len=16),
                              CacheConfig(chunk_pages=chunk_pages))
    assert lay.num_chunks == num_chunks
    return lay


def test_the_tiny_layout_packs_several_compressed_pages_per_chunk():
    lay = tiny_layout(4)
    assert lay.chunk_pages == 1 and lay.compress_pages_per_chunk >= 4


def test_allocation_maps_logical_ids_to_pages_and_free_returns_chunks():
    arena = UnifiedKvArena(tiny_layout(4, chunk_pages=2))
    k, s = arena.pages_per_chunk(COMPRESS), arena.pages_per_chunk(STATE)
    assert s == 2  # 2 state pages of a request's 19200 B state in a chunk of 47104 B
    got = arena.alloc(swa=[10, 11], compress=[0, 1, 2], state=[7, 9])
    assert got == {SWA: [0, 1], COMPRESS: [k, k + 1, k + 2], STATE: [2 * s, 2 * s + 1]}
    assert arena.page(SWA, 11) == 1 and arena.page(COMPRESS, 2) == k + 2 and arena.page(STATE, 9) == 2 * s + 1
    arena.free(SWA, [10])
    assert arena.num_free_chunks() == 1
    arena.free(STATE, [7, 9])
    assert arena.num_free_chunks() == 2 and not arena.is_backed(SWA, 10) and not arena.is_backed(STATE, 7)
    arena.check_integrity()


def test_an_allocation_that_does_not_fit_changes_nothing():
    arena = UnifiedKvArena(tiny_layout(4))
    arena.alloc(swa=[0, 1, 2])
    before = (arena.num_free_chunks(), arena.num_used(SWA), arena.num_used(COMPRESS), arena.num_used(STATE))
    with pytest.raises(ArenaEmpty, match="1 state pages"):
        arena.alloc(swa=[3], state=[0])
    assert (arena.num_free_chunks(), arena.num_used(SWA), arena.num_used(COMPRESS), arena.num_used(STATE)) == before
    assert not arena.is_backed(SWA, 3) and not arena.is_backed(STATE, 0)
    arena.check_integrity()


def test_a_chunk_lent_to_the_state_owner_holds_whole_request_state_pages():
    lay = tiny_layout(4)
    arena = UnifiedKvArena(lay)
    s = lay.state_pages_per_chunk
    assert s >= 1 and arena.pages_per_chunk(STATE) == s and lay.state_page_bytes * s == lay.chunk_bytes
    arena.alloc(state=list(range(s)))
    assert arena.owned_chunks(STATE) == 1 and arena.num_free_chunks() == 3
    arena.alloc(state=[s])
    assert arena.owned_chunks(STATE) == 2
    assert arena.usage()[STATE] == 2 * lay.chunk_bytes


def test_allocating_an_already_backed_id_or_freeing_an_unbacked_one_raises():
    arena = UnifiedKvArena(tiny_layout(4))
    arena.alloc(compress=[3])
    with pytest.raises(ArenaError, match="already backed"):
        arena.alloc(compress=[3])
    with pytest.raises(ArenaError, match="holds no page"):
        arena.free(SWA, [3])


def test_evict_then_drain_all_capacity_moves_between_all_three_owners():
    lay = tiny_layout(4)
    arena = UnifiedKvArena(lay)
    k, s = lay.compress_pages_per_chunk, lay.state_pages_per_chunk
    arena.alloc(compress=list(range(4 * k)))
    assert arena.num_free_chunks() == 0 and not arena.can_alloc(swa=1) and not arena.can_alloc(state=1)
    arena.free(COMPRESS, range(4 * k))
    arena.alloc(state=list(range(4 * s)))
    assert arena.num_used(STATE) == 4 * s and arena.owned_chunks(COMPRESS) == 0 and not arena.can_alloc(swa=1)
    arena.free(STATE, range(4 * s))
    arena.alloc(swa=list(range(4)))
    assert arena.num_used(SWA) == 4 and arena.owned_chunks(STATE) == 0
    arena.free(SWA, range(4))
    arena.alloc(compress=list(range(100, 100 + 4 * k)))  # the ids used before, reused after the other rounds
    arena.check_integrity()
    assert arena.num_used(COMPRESS) == 4 * k


def test_a_reserved_state_pool_lends_nothing_and_takes_no_chunk():
    from dataclasses import replace

    lay = replace(tiny_layout(4), reserved_state_slots=2)
    arena = UnifiedKvArena(lay)
    arena.alloc(state=[0, 1])
    assert arena.num_free_chunks() == 4 and not arena.can_alloc(state=1)
    with pytest.raises(ArenaEmpty):
        arena.alloc(state=[2])
    arena.free(STATE, [0])
    assert arena.can_alloc(state=1) and arena.usage()[STATE] == 2 * lay.spec.request_state_bytes
    arena.check_integrity()


def live_byte_ranges(arena: UnifiedKvArena) -> list[tuple[int, int, str]]:
    """Byte ranges of every live page, computed from the layout formulas (not from the maps)."""
    lay = arena.layout
    out = []
    for lid, page in arena.mapping(SWA).items():
        start = page * lay.swa_page_bytes
        out.append((start, start + lay.spec.swa_block_bytes, f"swa {lid}"))
    for lid, page in arena.mapping(STATE).items():
        start = page * lay.state_page_bytes
        assert start // lay.chunk_bytes == page // lay.state_pages_per_chunk  # whole pages inside one chunk
        out.append((start, start + lay.spec.request_state_bytes, f"state {lid}"))
    for lid, page in arena.mapping(COMPRESS).items():
        chunk, local = divmod(page, lay.compress_pages_per_chunk)
        for layer in lay.spec.compressed_layers:
            regions = [lay.compressed_rows(layer)] + ([lay.index_rows(layer)] if layer in lay.spec.csa_layers else [])
            for reg in regions:
                first = reg.offset + reg.row(page, 0) * reg.row_bytes
                assert first == chunk * lay.chunk_bytes + reg.offset + local * reg.used_rows * reg.row_bytes
                out.append((first, first + reg.used_rows * reg.row_bytes, f"comp {lid} L{layer}"))
    return sorted(out)


class ArenaMachine(RuleBasedStateMachine):
    """Random alloc / free / lend sequences across the three owners; every step re-checks the invariants."""

    def __init__(self):
        super().__init__()
        self.layout = tiny_layout(5, chunk_pages=2)
        self.arena = UnifiedKvArena(self.layout)
        self.live = {owner: set() for owner in OWNERS}
        self.next_id = 0

    @rule(n_swa=st.integers(0, 3), n_comp=st.integers(0, 9), n_state=st.integers(0, 4))
    def alloc(self, n_swa, n_comp, n_state):
        ids = {o: list(range(self.next_id, self.next_id + n)) for o, n in zip(OWNERS, (n_swa, n_comp, n_state))}
        self.next_id += max(n_swa, n_comp, n_state)
        before = {o: self.arena.mapping(o) for o in OWNERS}
        free_before = self.arena.num_free_chunks()
        fits = self.arena.can_alloc(n_swa, n_comp, n_state)
        try:
            self.arena.alloc(swa=ids[SWA], compress=ids[COMPRESS], state=ids[STATE])
        except ArenaEmpty:
            assert not fits
            assert {o: self.arena.mapping(o) for o in OWNERS} == before, "rollback left a trace"
            assert self.arena.num_free_chunks() == free_before, "rollback kept a chunk"
            return
        assert fits
        for owner in OWNERS:
            self.live[owner].update(ids[owner])

    @precondition(lambda self: any(self.live.values()))
    @rule(data=st.data(), owner=st.sampled_from(OWNERS))
    def free_some(self, data, owner):
        if not self.live[owner]:
            return
        ids = data.draw(st.lists(st.sampled_from(sorted(self.live[owner])), min_size=1, unique=True))
        self.arena.free(owner, ids)
        self.live[owner].difference_update(ids)

    @rule()
    def double_free_is_refused(self):
        with pytest.raises(ArenaError):
            self.arena.free(SWA, [-1])

    @invariant()
    def conserved_single_owner_and_disjoint(self):
        self.arena.check_integrity()
        lay = self.layout
        used_chunks = sum(self.arena.owned_chunks(owner) for owner in OWNERS)
        assert used_chunks + self.arena.num_free_chunks() == lay.num_chunks
        for owner in OWNERS:
            assert self.arena.num_used(owner) == len(self.live[owner])
        ranges = live_byte_ranges(self.arena)
        for (a0, a1, an), (b0, b1, bn) in zip(ranges, ranges[1:]):
            assert a1 <= b0, f"{an} [{a0},{a1}) overlaps {bn} [{b0},{b1})"
        assert not ranges or ranges[-1][1] <= lay.arena_bytes


TestArenaStateMachine = ArenaMachine.TestCase
TestArenaStateMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
