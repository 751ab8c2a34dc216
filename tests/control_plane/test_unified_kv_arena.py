"""UnifiedKvArena: all-or-nothing allocation, lending between owners, and no aliasing, ever."""

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from atom.config import CacheConfig, Dsv4KvSpec, SchedulerConfig
from atom.model_engine.chunk_arena import ArenaEmpty, ArenaError
from atom.model_engine.kv_layout import KvLayout
from atom.model_engine.unified_kv_arena import COMPRESS, SWA, UnifiedKvArena


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
    arena = UnifiedKvArena(tiny_layout(3))
    k = arena.pages_per_chunk(COMPRESS)
    got = arena.alloc(swa=[10, 11], compress=[0, 1, 2])
    assert got == {SWA: [0, 1], COMPRESS: [2 * k, 2 * k + 1, 2 * k + 2]}
    assert arena.page(SWA, 11) == 1 and arena.page(COMPRESS, 2) == 2 * k + 2
    arena.free(SWA, [10])
    assert arena.num_free_chunks() == 1 and not arena.is_backed(SWA, 10)
    arena.check_integrity()


def test_an_allocation_that_does_not_fit_changes_nothing():
    arena = UnifiedKvArena(tiny_layout(3))
    arena.alloc(swa=[0, 1])
    before = (arena.num_free_chunks(), arena.num_used(SWA), arena.num_used(COMPRESS))
    with pytest.raises(ArenaEmpty):
        arena.alloc(swa=[2], compress=[0])
    assert (arena.num_free_chunks(), arena.num_used(SWA), arena.num_used(COMPRESS)) == before
    assert not arena.is_backed(SWA, 2) and not arena.is_backed(COMPRESS, 0)
    arena.check_integrity()


def test_allocating_an_already_backed_id_or_freeing_an_unbacked_one_raises():
    arena = UnifiedKvArena(tiny_layout(3))
    arena.alloc(compress=[3])
    with pytest.raises(ArenaError, match="already backed"):
        arena.alloc(compress=[3])
    with pytest.raises(ArenaError, match="holds no page"):
        arena.free(SWA, [3])


def test_evict_then_drain_all_capacity_moves_to_the_other_owner():
    lay = tiny_layout(4)
    arena = UnifiedKvArena(lay)
    k = lay.compress_pages_per_chunk
    arena.alloc(compress=list(range(4 * k)))
    assert arena.num_free_chunks() == 0 and not arena.can_alloc(swa=1)
    arena.free(COMPRESS, range(4 * k))
    arena.alloc(swa=list(range(4)))
    assert arena.num_used(SWA) == 4 and arena.owned_chunks(COMPRESS) == 0
    arena.free(SWA, range(4))
    arena.alloc(compress=list(range(100, 100 + 4 * k)))  # the ids used before, reused after the SWA round
    arena.check_integrity()
    assert arena.num_used(COMPRESS) == 4 * k


def live_byte_ranges(arena: UnifiedKvArena) -> list[tuple[int, int, str]]:
    """Byte ranges of every live page, computed from the layout formulas (not from the maps)."""
    lay = arena.layout
    out = []
    for lid, page in arena._phys[SWA].items():
        start = page * lay.swa_page_bytes
        out.append((start, start + lay.spec.swa_block_bytes, f"swa {lid}"))
    for lid, page in arena._phys[COMPRESS].items():
        chunk, local = divmod(page, lay.compress_pages_per_chunk)
        for layer in lay.spec.compressed_layers:
            regions = [lay.compressed_rows(layer)] + ([lay.index_rows(layer)] if layer in lay.spec.csa_layers else [])
            for reg in regions:
                first = reg.offset + reg.row(page, 0) * reg.row_bytes
                assert first == chunk * lay.chunk_bytes + reg.offset + local * reg.used_rows * reg.row_bytes
                out.append((first, first + reg.used_rows * reg.row_bytes, f"comp {lid} L{layer}"))
    return sorted(out)


class ArenaMachine(RuleBasedStateMachine):
    """Random alloc / free / lend sequences across both owners; every step re-checks the invariants."""

    def __init__(self):
        super().__init__()
        self.layout = tiny_layout(5, chunk_pages=2)
        self.arena = UnifiedKvArena(self.layout)
        self.live = {SWA: set(), COMPRESS: set()}
        self.next_id = 0

    @rule(n_swa=st.integers(0, 3), n_comp=st.integers(0, 9))
    def alloc(self, n_swa, n_comp):
        swa = list(range(self.next_id, self.next_id + n_swa))
        comp = list(range(self.next_id, self.next_id + n_comp))
        self.next_id += max(n_swa, n_comp)
        before = {o: dict(self.arena._phys[o]) for o in (SWA, COMPRESS)}
        fits = self.arena.can_alloc(n_swa, n_comp)
        try:
            self.arena.alloc(swa=swa, compress=comp)
        except ArenaEmpty:
            assert not fits
            assert {o: dict(self.arena._phys[o]) for o in (SWA, COMPRESS)} == before, "rollback left a trace"
            return
        assert fits
        self.live[SWA].update(swa)
        self.live[COMPRESS].update(comp)

    @precondition(lambda self: self.live[SWA] or self.live[COMPRESS])
    @rule(data=st.data(), owner=st.sampled_from([SWA, COMPRESS]))
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
        used_chunks = self.arena.owned_chunks(SWA) + self.arena.owned_chunks(COMPRESS)
        assert used_chunks + self.arena.num_free_chunks() == lay.num_chunks
        assert self.arena.num_used(SWA) == len(self.live[SWA])
        assert self.arena.num_used(COMPRESS) == len(self.live[COMPRESS])
        ranges = live_byte_ranges(self.arena)
        for (a0, a1, an), (b0, b1, bn) in zip(ranges, ranges[1:]):
            assert a1 <= b0, f"{an} [{a0},{a1}) overlaps {bn} [{b0},{b1})"
        assert not ranges or ranges[-1][1] <= lay.arena_bytes


TestArenaStateMachine = ArenaMachine.TestCase
TestArenaStateMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
