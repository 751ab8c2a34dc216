"""ChunkArena and ChunkBackedFreeList: exact ids, packing, and loud misuse."""

import pytest

from atom.kv.chunk_arena import ArenaEmpty, ArenaError, ChunkArena, ChunkBackedFreeList


def test_a_fresh_arena_hands_out_chunks_from_the_front_and_reuses_the_last_released():
    arena = ChunkArena(3)
    assert [arena.acquire(), arena.acquire()] == [0, 1]
    arena.release(0)
    assert arena.acquire() == 0
    assert arena.acquire() == 2
    with pytest.raises(ArenaEmpty):
        arena.acquire()


def test_releasing_a_chunk_twice_or_outside_the_arena_raises():
    arena = ChunkArena(2)
    c = arena.acquire()
    arena.release(c)
    with pytest.raises(ArenaError, match="released twice"):
        arena.release(c)
    with pytest.raises(ArenaError, match="outside the arena"):
        arena.release(7)


def test_pages_are_cut_from_one_chunk_before_the_next_is_borrowed():
    arena = ChunkArena(4)
    swa = ChunkBackedFreeList(arena, 3, "swa")
    assert [swa.pop() for _ in range(4)] == [0, 1, 2, 3]
    assert swa.owned_chunks() == [0, 1]
    assert arena.num_free() == 2


def test_pop_packs_into_the_fullest_owned_chunk():
    arena = ChunkArena(4)
    comp = ChunkBackedFreeList(arena, 4, "compress")
    pages = [comp.pop() for _ in range(8)]  # chunks 0 and 1 full
    assert pages == list(range(8))
    comp.free(0)  # chunk 0: 3 used
    comp.free(4)
    comp.free(5)  # chunk 1: 2 used
    assert comp.pop() == 0  # refill the fullest chunk (0) first
    assert comp.pop() in (4, 5)


def test_a_chunk_returns_to_the_arena_only_when_all_its_pages_are_free():
    arena = ChunkArena(2)
    comp = ChunkBackedFreeList(arena, 3, "compress")
    a, b = comp.pop(), comp.pop()
    comp.free(a)
    assert arena.num_free() == 1 and comp.owned_chunks() == [0]
    comp.free(b)
    assert arena.num_free() == 2 and comp.owned_chunks() == []


def test_a_double_free_raises():
    comp = ChunkBackedFreeList(ChunkArena(2), 3, "compress")
    a, _ = comp.pop(), comp.pop()
    comp.free(a)
    with pytest.raises(ArenaError, match="freed twice"):
        comp.free(a)


def test_freeing_a_page_whose_chunk_went_back_to_the_arena_raises_instead_of_aliasing():
    arena = ChunkArena(1)
    comp = ChunkBackedFreeList(arena, 2, "compress")
    swa = ChunkBackedFreeList(arena, 1, "swa")
    p = comp.pop()
    comp.free(p)  # chunk 0 returns to the arena
    assert swa.pop() == 0  # and the SWA owner borrows it
    with pytest.raises(ArenaError, match="does not hold"):
        comp.free(p)
    swa.check_integrity()
    comp.check_integrity()


def test_freeing_a_page_never_borrowed_raises():
    comp = ChunkBackedFreeList(ChunkArena(2), 4, "compress")
    with pytest.raises(ArenaError, match="does not hold"):
        comp.free(5)


def test_available_counts_own_free_pages_plus_whole_free_chunks():
    arena = ChunkArena(3)
    comp = ChunkBackedFreeList(arena, 4, "compress")
    comp.pop()
    assert comp.free_now() == 3
    assert comp.available() == 3 + 2 * 4
    assert comp.chunks_needed(3) == 0 and comp.chunks_needed(4) == 1 and comp.chunks_needed(8) == 2


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_pages_per_chunk_must_be_a_positive_integer(bad):
    with pytest.raises(ValueError, match="pages_per_chunk"):
        ChunkBackedFreeList(ChunkArena(1), bad, "x")
