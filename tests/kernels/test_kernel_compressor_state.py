"""Compressor rings and the CSA boundary state: references vs loops, Triton vs references, capture/restore."""

import pytest
import torch
from support.kernels import assert_same_bits, i32, ragged, random_rows

from atom.kernels.compressor_state import (compressor_state_update, compressor_state_update_ref,
                                           csa_boundary_capture, csa_boundary_capture_ref, csa_boundary_restore,
                                           csa_boundary_restore_ref, csa_state_write, csa_state_write_ref)

BS = 16  # tokens per block (tiny model: lcm of ratios 4 and 16)
NAN = float("nan")

UPDATE = {"triton": compressor_state_update, "torch": compressor_state_update_ref}
CAPTURE = {"triton": csa_boundary_capture, "torch": csa_boundary_capture_ref}
RESTORE = {"triton": csa_boundary_restore, "torch": csa_boundary_restore_ref}


def nan_state(slots, ring, width):
    return torch.full((slots, ring, width), NAN), torch.full((slots, ring, width), NAN)


def strided_boundary(pages, width, page_pitch=None):
    """[pages, 4, width] fp32 view with an arbitrary page stride (as inside an SWA page)."""
    pitch = page_pitch or 4 * width + 5
    buf = torch.full((pages * pitch + 3,), NAN)
    return buf, buf[3:3 + pages * pitch].view(pages, pitch)[:, :4 * width].view(pages, 4, width)


def projections(n, width, ratio, gen):
    return random_rows(n, width, torch.float32, gen), random_rows(n, width, torch.float32, gen), \
        random_rows(ratio, width, torch.float32, gen)


def test_update_reference_equals_a_sequential_token_loop(gen):
    lens, starts = [11, 3, 0, 9], [0, 13, 4, 30]
    cu, pos_start = ragged(lens, starts)
    kv, score, ape = projections(sum(lens), 6, 4, gen)
    slots = i32([2, 0, 1, -1])
    kv_s, sc_s = nan_state(3, 8, 6)
    compressor_state_update_ref(kv, score, ape, kv_s, sc_s, slots, cu, pos_start)
    want_kv, want_sc = nan_state(3, 8, 6)
    t = 0
    for s, (n, p0) in enumerate(zip(lens, starts)):
        for j in range(n):  # every token in order: later positions overwrite earlier ones
            if slots[s] >= 0:
                want_kv[slots[s], (p0 + j) % 8] = kv[t]
                want_sc[slots[s], (p0 + j) % 8] = score[t] + ape[(p0 + j) % 4]
            t += 1
    assert_same_bits(kv_s, want_kv)
    assert_same_bits(sc_s, want_sc)


@pytest.mark.parametrize("ring,ratio,width", [(8, 4, 24), (16, 16, 12)], ids=["csa", "hca"])
def test_triton_update_equals_the_reference(ring, ratio, width, gen):
    lens, starts = [21, 1, 5, 0, 40], [3, 17, 0, 9, 16]
    cu, pos_start = ragged(lens, starts)
    kv, score, ape = projections(sum(lens), width, ratio, gen)
    slots = i32([4, 1, -1, 0, 2])
    got, ref = nan_state(5, ring, width), nan_state(5, ring, width)
    compressor_state_update(kv, score, ape, *got, slots, cu, pos_start)
    compressor_state_update_ref(kv, score, ape, *ref, slots, cu, pos_start)
    assert_same_bits(got[0], ref[0])
    assert_same_bits(got[1], ref[1])


def test_capture_reference_equals_a_token_loop(gen):
    lens, starts = [40, 6], [2, 10]  # seq 0 crosses blocks 0, 1 and 2 in one chunk
    cu, pos_start = ragged(lens, starts)
    kv, score, ape = projections(sum(lens), 5, 4, gen)
    table = i32([[3, 0, -1], [1, -1, 2]])
    kv_buf, kv_dst = strided_boundary(4, 5)
    sc_buf, sc_dst = strided_boundary(4, 5)
    csa_boundary_capture_ref(kv, score, ape, kv_dst, sc_dst, table, cu, pos_start, block_size=BS)
    want_kv, want_sc = torch.full((4, 4, 5), NAN), torch.full((4, 4, 5), NAN)
    t = 0
    for s, (n, p0) in enumerate(zip(lens, starts)):
        for j in range(n):
            p = p0 + j
            page = int(table[s, p // BS])
            if p % BS >= BS - 4 and page >= 0:
                want_kv[page, p % BS - (BS - 4)] = kv[t]
                want_sc[page, p % BS - (BS - 4)] = score[t] + ape[p % 4]
            t += 1
    assert_same_bits(kv_dst, want_kv)
    assert_same_bits(sc_dst, want_sc)
    assert int((~want_kv.isnan()).any(-1).sum()) == 4 + 4 + 4  # blocks 0, 1 of seq 0 and block 0 of seq 1


@pytest.mark.parametrize("width", [8, 20])
def test_triton_capture_equals_the_reference(width, gen):
    lens, starts = [37, 4, 14, 2], [0, 12, 18, 46]
    cu, pos_start = ragged(lens, starts)
    kv, score, ape = projections(sum(lens), width, 4, gen)
    table = i32([[0, 1, 2, 3], [4, -1, 5, 6], [7, 8, -1, 9], [10, 11, 12, -1]])
    bufs = [strided_boundary(13, width) for _ in range(4)]
    csa_boundary_capture(kv, score, ape, bufs[0][1], bufs[1][1], table, cu, pos_start, block_size=BS)
    csa_boundary_capture_ref(kv, score, ape, bufs[2][1], bufs[3][1], table, cu, pos_start, block_size=BS)
    assert_same_bits(bufs[0][0], bufs[2][0])
    assert_same_bits(bufs[1][0], bufs[3][0])
    assert int((~bufs[2][1].isnan()).any(-1).sum()) > 8


@pytest.mark.parametrize("write", [csa_state_write, csa_state_write_ref], ids=["triton", "torch"])
@pytest.mark.parametrize("width", [8, 20])
def test_one_state_write_equals_the_update_then_the_capture(write, width, gen):
    """Ragged chunks (one crossing three blocks, one empty), a skipped slot, missing pages, strided rows (the
    kv / score columns of one projection) and capture positions moved back by whole blocks."""
    lens, starts = [37, 4, 0, 14, 2], [3, 12, 7, 18, 46]
    cu, pos_start = ragged(lens, starts)
    rows = random_rows(sum(lens), 2 * width, torch.float32, gen)
    kv, score, ape = rows[:, :width], rows[:, width:], random_rows(4, width, torch.float32, gen)
    slots = i32([2, -1, 4, 0, 3])
    table = i32([[0, 1, 2, 3], [4, -1, 5, 6], [7, 8, 9, 10], [-1, 11, 12, -1], [10, 11, 12, -1]])
    capture_start = pos_start - i32([0, 0, 0, 16, 32])  # the table's first column is the chunk's first block
    got_state, want_state = nan_state(5, 8, width), nan_state(5, 8, width)
    got_dst = [strided_boundary(13, width) for _ in range(2)]
    want_dst = [strided_boundary(13, width) for _ in range(2)]
    write(kv, score, ape, *got_state, slots, got_dst[0][1], got_dst[1][1], table, cu, pos_start, capture_start,
          block_size=BS)
    compressor_state_update_ref(kv, score, ape, *want_state, slots, cu, pos_start)
    csa_boundary_capture_ref(kv, score, ape, want_dst[0][1], want_dst[1][1], table, cu, capture_start, block_size=BS)
    for got, want in zip(got_state + (got_dst[0][0], got_dst[1][0]), want_state + (want_dst[0][0], want_dst[1][0])):
        assert_same_bits(got, want)
    assert int((~want_dst[0][1].isnan()).any(-1).sum()) > 8 and int((~want_state[0].isnan()).any(-1).sum()) > 8


def test_restore_reference_equals_a_row_loop(gen):
    src_kv, src_sc = random_rows(3 * 4, 6, torch.float32, gen).view(3, 4, 6), torch.randn(3, 4, 6, generator=gen)
    restore_src, slots, resume = i32([2, -1, 0, 1]), i32([0, 1, -1, 3]), i32([16, 32, 16, 48])
    kv_s, sc_s = nan_state(4, 8, 6)
    csa_boundary_restore_ref(src_kv, src_sc, kv_s, sc_s, restore_src, slots, resume)
    want_kv, want_sc = nan_state(4, 8, 6)
    for page, slot, p in zip(restore_src.tolist(), slots.tolist(), resume.tolist()):
        if page >= 0 and slot >= 0:
            for j in range(4):
                want_kv[slot, (p - 4 + j) % 8] = src_kv[page, j]
                want_sc[slot, (p - 4 + j) % 8] = src_sc[page, j]
    assert_same_bits(kv_s, want_kv)
    assert_same_bits(sc_s, want_sc)
    assert int((~kv_s.isnan()).any(-1).sum()) == 8


def test_triton_restore_equals_the_reference(gen):
    src = [strided_boundary(5, 12)[1] for _ in range(2)]
    for t in src:
        t.copy_(torch.randn(5, 4, 12, generator=gen))
    restore_src, slots, resume = i32([4, 0, -1, 3, 2]), i32([1, 3, 2, -1, 0]), i32([16, 4, 32, 16, 12])
    got, ref = nan_state(4, 8, 12), nan_state(4, 8, 12)
    csa_boundary_restore(*src, *got, restore_src, slots, resume)
    csa_boundary_restore_ref(*src, *ref, restore_src, slots, resume)
    assert_same_bits(got[0], ref[0])
    assert_same_bits(got[1], ref[1])


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_capture_then_restore_reproduces_the_ring_rows_bit_exactly(backend, gen):
    """Two chunks per sequence, the second ending at the boundary P; a fresh NaN slot gets the rows back."""
    width, P = 10, 2 * BS
    first, second = [13, 7], [P - 13, P - 7]  # chunk 1: positions 0..12 / 0..6, chunk 2 up to P - 1
    update, capture, restore = UPDATE[backend], CAPTURE[backend], RESTORE[backend]
    live = nan_state(2, 8, width)
    for s in range(2):
        live[0][s].zero_()
        live[1][s].fill_(float("-inf"))
    pages = strided_boundary(6, width)[1], strided_boundary(6, width)[1]
    table = i32([[4, 1], [0, 5]])
    for lens, starts in ((first, [0, 0]), (second, first)):
        cu, pos_start = ragged(lens, starts)
        kv, score, ape = projections(sum(lens), width, 4, gen)
        update(kv, score, ape, *live, i32([0, 1]), cu, pos_start)  # capture runs after the update
        capture(kv, score, ape, *pages, table, cu, pos_start, block_size=BS)
    fresh = nan_state(3, 8, width)
    restore(*pages, *fresh, i32([1, 5]), i32([2, 0]), i32([P, P]))  # terminal block's page of each seq
    ring_rows = [(P - 4 + j) % 8 for j in range(4)]
    for seq, slot in ((0, 2), (1, 0)):
        for k in range(2):
            assert not bool(fresh[k][slot, ring_rows].isnan().any())
            assert_same_bits(fresh[k][slot, ring_rows], live[k][seq, ring_rows])


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_a_missing_capture_page_is_skipped_and_page_zero_stays_untouched(backend, gen):
    cu, pos_start = ragged([BS], [0])
    kv, score, ape = projections(BS, 4, 4, gen)
    kv_dst, sc_dst = torch.full((2, 4, 4), NAN), torch.full((2, 4, 4), NAN)
    CAPTURE[backend](kv, score, ape, kv_dst, sc_dst, i32([[-1]]), cu, pos_start, block_size=BS)
    assert bool(kv_dst.isnan().all()) and bool(sc_dst.isnan().all())


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_a_missing_restore_source_leaves_the_slot_untouched(backend):
    src = torch.ones(2, 4, 4), torch.ones(2, 4, 4)
    state = nan_state(2, 8, 4)
    RESTORE[backend](*src, *state, i32([-1, 1]), i32([0, -1]), i32([16, 16]))
    assert bool(state[0].isnan().all()) and bool(state[1].isnan().all())


def _update_args():
    cu, pos_start = ragged([3], [0])
    return dict(kv=torch.zeros(3, 4), score=torch.zeros(3, 4), ape=torch.zeros(4, 4),
                kv_state=torch.zeros(2, 8, 4), score_state=torch.zeros(2, 8, 4), state_slot=i32([1]),
                cu_seqlens=cu, pos_start=pos_start)


UPDATE_BAD = {
    "bf16 kv": (dict(kv=torch.zeros(3, 4, dtype=torch.bfloat16)), "dtype"),
    "score rows differ": (dict(score=torch.zeros(2, 4)), "rows"),
    "state width": (dict(kv_state=torch.zeros(2, 8, 5)), "width"),
    "state shapes differ": (dict(score_state=torch.zeros(2, 4, 4)), "differ"),
    "slot out of range": (dict(state_slot=i32([2])), "state_slot"),
    "cu_seqlens past the tokens": (dict(cu_seqlens=i32([0, 4])), "cu_seqlens"),
    "negative start": (dict(pos_start=i32([-1])), "pos_start"),
    "state inner dim strided": (dict(kv_state=torch.zeros(2, 8, 8)[:, :, ::2]), "contiguous"),
}


@pytest.mark.parametrize("case", list(UPDATE_BAD))
@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_update_wrapper_rejects_bad_arguments(backend, case):
    args = _update_args()
    change, needle = UPDATE_BAD[case]
    args.update(change)
    with pytest.raises(ValueError, match=needle):
        UPDATE[backend](**args)


CAPTURE_BAD = {
    "a page past the two boundary views": (4, 2, "capture_table"),
    "boundary views of three rows, not four": (3, 0, "4"),
}


@pytest.mark.parametrize("case", list(CAPTURE_BAD))
@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_capture_wrapper_rejects_a_page_past_the_views_or_views_without_four_rows(backend, case):
    view_rows, page, needle = CAPTURE_BAD[case]
    cu, pos_start = ragged([BS], [0])
    dst = torch.zeros(2, view_rows, 4), torch.zeros(2, view_rows, 4)
    with pytest.raises(ValueError, match=needle):
        CAPTURE[backend](torch.zeros(BS, 4), torch.zeros(BS, 4), torch.zeros(4, 4), *dst, i32([[page]]), cu,
                         pos_start, block_size=BS)


@pytest.mark.parametrize("resume,needle", [(2, "resume_pos"), (18, "multiple of 4")])
@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_restore_wrapper_rejects_a_resume_position_that_is_no_boundary(backend, resume, needle):
    state = torch.zeros(1, 8, 4), torch.zeros(1, 8, 4)
    with pytest.raises(ValueError, match=needle):
        RESTORE[backend](torch.zeros(1, 4, 4), torch.zeros(1, 4, 4), *state, i32([0]), i32([0]), i32([resume]))
