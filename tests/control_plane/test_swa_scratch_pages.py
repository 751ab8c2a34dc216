"""SWA blocks a step writes that leave the window at the end of that step: a page for the step, no
logical id (``SCRATCH`` in the table), and the page kept spare by the arena for the next such step."""

from atom.bench.control_plane_ops import Workload, _block_manager
from atom.bench.sim_arenas import split_arena
from atom.kv.kv_holdings import SCRATCH
from atom.kv.page_map import SWA
from atom.kv.swa_pool import _scratch_pages
from atom.model_engine.sequence import Sequence
from atom.sampling_params import SamplingParams

SHARED = [(j * 13) % 50000 + 1 for j in range(1024)]


def _prompt_seq(tokens: list[int]) -> Sequence:
    return Sequence(tokens, SamplingParams(max_tokens=2), 128)


def test_a_4k_prompt_in_one_chunk_backs_30_of_its_32_swa_blocks_for_the_step_only():
    bm = _block_manager(Workload("w", 2, 4096), 128, 2)
    seq = _prompt_seq(list(range(1, 4097)))
    assert bm.admit(seq, 4096) == 4096
    held = bm.holdings[seq.seq_id].swa
    # the window after the step starts at block 31; block 30 is the window before the prompt's last
    # boundary (kept for a repeat of the prompt), block 31 stays in the window
    assert held.blocks[:30] == [SCRATCH] * 30 and min(held.blocks[30:]) >= 0
    assert len(set(held.pages)) == 32 and min(held.pages) >= 0
    assert bm.arena.num_unmapped(SWA) == 30 and bm.swa.pool.num_used() == 2
    bm.check_integrity([seq])  # mid-step: scratch pages are counted
    scratch_pages = held.pages[:30]
    seq.num_computed_tokens = 4096
    bm.after_step(seq)
    assert held.blocks[:30] == [-1] * 30 and held.pages[:30] == [-1] * 30
    assert bm.arena.num_unmapped(SWA) == 0 and sorted(bm.arena.spare_pages(SWA)) == sorted(scratch_pages)
    bm.check_integrity([seq])


def test_the_next_chunk_takes_the_spare_pages_before_any_page_of_the_free_list():
    bm = _block_manager(Workload("w", 1, 16384), 128, 2)
    seq = _prompt_seq(list(range(1, 16385)))
    assert bm.admit(seq, 8192) == 8192
    seq.num_computed_tokens = 8192
    bm.after_step(seq)
    spare = bm.arena.spare_pages(SWA)
    assert len(spare) == 63  # blocks 0-62 left the window; 63 is still in it
    used_before = bm.arena._lists[SWA].num_used()
    bm.grow(seq, 8192)
    held = bm.holdings[seq.seq_id].swa
    assert set(spare) <= set(held.pages[64:]) and bm.arena.spare_pages(SWA) == []
    assert bm.arena._lists[SWA].num_used() == used_before + 1  # 63 lent again, 1 from the free list
    bm.check_integrity([seq])


def test_a_request_freed_between_its_growth_and_its_step_end_returns_its_scratch_pages():
    bm = _block_manager(Workload("w", 2, 4096), 128, 2)
    seq = _prompt_seq(list(range(1, 4097)))
    assert bm.admit(seq, 4096) == 4096
    bm.free(seq)
    assert bm.arena.num_unmapped(SWA) == 0 and len(bm.arena.spare_pages(SWA)) == 30
    bm.check_integrity([])
    assert bm.arena.num_used(SWA) == 0  # a usage query hands the spare pages back to the free list
    assert bm.arena.spare_pages(SWA) == [] and bm.arena._lists[SWA].num_used() == 0
    bm.check_integrity([])


def test_a_waiting_request_keeps_the_window_its_producer_backed_for_one_step_and_hits_it():
    bm = _block_manager(Workload("w", 3, 1224, shared=1024), 128, 2)
    first = _prompt_seq(SHARED + [1] * 200)
    second = _prompt_seq(SHARED + [2] * 200)
    assert bm.admit_unless_waiting(first, 1224) == 1224
    produced = bm.holdings[first.seq_id].swa
    assert produced.blocks[:8] == [SCRATCH] * 8  # blocks 0-7 leave the window at the end of the step
    assert bm.admit_unless_waiting(second, 1224) is None  # the shared run (8 blocks) is being computed
    assert produced.blocks[:7] == [SCRATCH] * 7 and produced.blocks[7] >= 0  # the window before block 8 kept
    bm.check_integrity([first])
    first.num_computed_tokens = 1224
    bm.after_step(first)
    assert bm.admit_unless_waiting(second, 1224) == 200
    assert second.num_cached_tokens == 1024
    bm.check_integrity([first, second])


def test_spare_pages_are_lent_first_and_any_query_that_would_see_them_frees_them():
    bm = _block_manager(Workload("w", 1, 4096), 128, 2)
    arena = bm.arena
    pages = arena.take_unmapped(SWA, 5)
    assert arena.num_unmapped(SWA) == 5
    arena.give_back_unmapped(SWA, pages)
    assert arena.num_unmapped(SWA) == 0 and arena.spare_pages(SWA) == pages
    assert arena.can_alloc(swa=5) and arena.spare_pages(SWA) == pages  # a fitting room check keeps them
    assert arena.take_unmapped(SWA, 3) == pages[2:]  # the latest given back first
    arena.check_integrity()
    assert arena.num_used(SWA) == 3 and arena.spare_pages(SWA) == []
    arena.give_back_unmapped(SWA, pages[2:])
    arena.check_integrity()
    assert arena.num_used(SWA) == 0 and arena.owned_chunks(SWA) == 0


def test_every_table_and_page_stays_consistent_mid_step_over_chunked_prompts_with_shared_prefixes(harness):
    h = harness(num_chunks=60, budget=40, max_model_len=256)
    scratch_seen = []

    def mid_step(batch) -> None:  # after the runner read and wrote the pages, before the step's end
        h.sched.check_integrity()
        scratch_seen.append(h.bm.arena.num_unmapped(SWA))

    h.observe(mid_step)
    shared = list(range(200, 248))
    seqs = [h.add(shared + [i] * (20 + 13 * i), max_tokens=3) for i in range(5)]
    h.run()
    assert all(len(s.output_token_ids) == 3 for s in seqs)
    assert max(scratch_seen) > 0 and scratch_seen[-1] == 0  # the content-checking runner read through them
    h.assert_all_memory_returned()


def test_a_fixed_split_arena_counts_pages_without_ids_as_used_until_mapped_or_given_back():
    bm = _block_manager(Workload("w", 1, 4096), 128, 2)
    _, arena = split_arena(bm.arena.layout, 0.5)
    arena.page_table(SWA, 16)  # (as the SWA pool sizes it)
    pages = arena.take_unmapped(SWA, 4)
    assert arena.num_used(SWA) == 4 and arena.num_unmapped(SWA) == 4
    arena.map_unmapped(SWA, [7, 8], pages[:2])
    assert arena.page(SWA, 8) == pages[1] and arena.num_unmapped(SWA) == 2
    arena.give_back_unmapped(SWA, pages[2:])
    assert arena.num_used(SWA) == 2 and arena.num_unmapped(SWA) == 0 and arena.spare_pages(SWA) == []
    arena.check_integrity()


def test_the_pages_given_back_are_those_of_the_scratch_entries_wherever_they_lie_in_the_run():
    pages = list(range(100, 110))

    def split(run: list[int], lo: int) -> tuple[list[int], list[tuple[int, int]]]:
        scratch, rest = _scratch_pages(run, pages, lo)
        return scratch, list(rest)
    assert split([SCRATCH, SCRATCH, 7, 8], 3) == ([103, 104], [(5, 7), (6, 8)])  # one stretch, leading
    assert split([4, 5, SCRATCH, SCRATCH, SCRATCH, 9], 1) == ([103, 104, 105], [(1, 4), (2, 5), (6, 9)])  # one stretch inside
    assert split([SCRATCH, 7, SCRATCH, -1], 2) == ([102, 104], [(3, 7), (5, -1)])  # two stretches
    assert split([5, 6], 0) == ([], [(0, 5), (1, 6)])
