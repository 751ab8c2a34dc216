"""Index builders: references against loops and hand-computed rows, Triton against references."""

import pytest
import torch
from support.kernels import assert_same_bits, i32, random_table

from atom.kernels.paged_index import build_comp_index, build_comp_index_ref, build_window_index, build_window_index_ref

BS, STRIDE, W = 8, 13, 6
EPB_HCA, RATIO_HCA = 1, 8  # hca: block 8, ratio 8 -> one entry per block
K, CHUNK_ROWS = 3, 10


def naive_window(table, seqs, positions, window):
    out = []
    for s, p in zip(seqs, positions):
        row = [-1] * window
        if s >= 0 and p >= 0:
            for w, q in enumerate(range(max(0, p - window + 1), p + 1)):
                page = table[s][q // BS]
                row[w] = page * STRIDE + q % BS if page >= 0 else -1
        out.append(row)
    return i32(out)


def naive_comp(table, seqs, positions, entries_of, width, epb):
    out = []
    for t, (s, p) in enumerate(zip(seqs, positions)):
        row = [-1] * width
        if s >= 0 and p >= 0:
            for w, i in enumerate(entries_of(t, p)):
                page = table[s][i // epb] if i >= 0 else -1
                row[w] = (page // K) * CHUNK_ROWS + (page % K) * epb + i % epb if page >= 0 else -1
        out.append(row)
    return i32(out)


def test_window_reference_gives_the_hand_computed_rows():
    table = i32([[3, -1, 5]])
    got = build_window_index_ref(table, i32([0, 0, 0]), i32([0, 9, 17]), window=4, block_size=BS, row_stride=STRIDE)
    assert got.tolist() == [
        [39, -1, -1, -1],  # pos 0: only itself, page 3 row 0 -> 39
        [45, 46, -1, -1],  # pos 9: 6, 7 in page 3; 8, 9 in block 1 (-1): masked, never page 0
        [-1, -1, 65, 66],  # pos 17: 14, 15 in block 1 (-1); 16, 17 in page 5 -> 65, 66
    ]


def test_window_reference_matches_a_naive_loop(gen):
    table = random_table(3, 6, 20, gen)
    seqs = i32([0, 1, 2, -1, 1, 0, 2])
    positions = i32([0, 5, 7, 3, 8, 47, 23])
    got = build_window_index_ref(table, seqs, positions, window=W, block_size=BS, row_stride=STRIDE)
    assert_same_bits(got, naive_window(table.tolist(), seqs.tolist(), positions.tolist(), W))


@pytest.mark.parametrize("window", [W, 20])
def test_triton_window_index_equals_the_reference(window, gen):
    table = random_table(4, 10, 45, gen, p_missing=0.2)
    seqs = torch.randint(-1, 4, (70,), generator=gen, dtype=torch.int32)
    positions = torch.randint(0, 80, (70,), generator=gen, dtype=torch.int32)
    positions[:6] = i32([0, 1, 7, 8, 15, 16])
    got = build_window_index(table, seqs, positions, window=window, block_size=BS, row_stride=STRIDE)
    ref = build_window_index_ref(table, seqs, positions, window=window, block_size=BS, row_stride=STRIDE)
    assert_same_bits(got, ref)
    assert int((ref >= 0).sum()) > 100


def test_hca_reference_lists_every_completed_entry_in_order(gen):
    table = random_table(2, 8, 18, gen)
    seqs, positions = i32([0, 0, 1, 1, -1]), i32([6, 7, 20, 63, 30])
    got = build_comp_index_ref(table, seqs, positions, None, width=9, ratio=RATIO_HCA, entries_per_block=EPB_HCA,
                               pages_per_chunk=K, chunk_rows=CHUNK_ROWS)
    want = naive_comp(table.tolist(), seqs.tolist(), positions.tolist(),
                      lambda t, p: range((p + 1) // RATIO_HCA), 9, EPB_HCA)
    assert_same_bits(got, want)
    assert (got[0] == -1).all() and int((got[1] != -1).sum()) <= 1  # pos 6 sees nothing, pos 7 entry 0


def test_csa_reference_translates_topk_entries_in_order(gen):
    epb = BS // 4
    table = random_table(2, 6, 18, gen)
    seqs, positions = i32([0, 1, 1, -1]), i32([3, 9, 23, 4])
    topk = i32([[0, -1, -1], [1, 0, -1], [5, -1, 3], [7, 7, 7]])  # padding token: ignored
    got = build_comp_index_ref(table, seqs, positions, topk, width=3, ratio=4, entries_per_block=epb,
                               pages_per_chunk=K, chunk_rows=CHUNK_ROWS)
    want = naive_comp(table.tolist(), seqs.tolist(), positions.tolist(), lambda t, p: topk[t].tolist(), 3, epb)
    assert_same_bits(got, want)


def test_comp_reference_gives_the_hand_computed_row():
    # entry 5 with epb 2 -> block 2, slot 1; page 4 -> chunk 1 (rows 10..), local page 1: 10 + 2 + 1 = 13
    got = build_comp_index_ref(i32([[0, 1, 4]]), i32([0]), i32([23]), i32([[5]]), width=1, ratio=4,
                               entries_per_block=2, pages_per_chunk=K, chunk_rows=CHUNK_ROWS)
    assert got.tolist() == [[13]]


@pytest.mark.parametrize("group", ["c4", "hca"])
def test_triton_comp_index_equals_the_reference(group, gen):
    ratio = 4 if group == "c4" else RATIO_HCA
    epb = BS // ratio
    table = random_table(3, 12, 40, gen, p_missing=0.2)
    seqs = torch.randint(-1, 3, (40,), generator=gen, dtype=torch.int32)
    positions = torch.randint(0, 12 * BS, (40,), generator=gen, dtype=torch.int32)
    topk = None
    if group == "c4":
        vis = ((positions.long() + 1) // ratio).clamp(min=1)
        topk = (torch.rand(40, 16, generator=gen) * vis[:, None]).long().to(torch.int32)
        topk[torch.rand(40, 16, generator=gen) < 0.3] = -1
        topk[(positions + 1) // ratio == 0] = -1
    width = 16 if group == "c4" else 12 * BS // ratio
    kw = dict(width=width, ratio=ratio, entries_per_block=epb, pages_per_chunk=K, chunk_rows=CHUNK_ROWS)
    got = build_comp_index(table, seqs, positions, topk, **kw)
    ref = build_comp_index_ref(table, seqs, positions, topk, **kw)
    assert_same_bits(got, ref)
    assert int((ref >= 0).sum()) > 40


COMP = {"triton": build_comp_index, "torch": build_comp_index_ref}
WINDOW = {"triton": build_window_index, "torch": build_window_index_ref}


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_topk_naming_an_entry_the_query_cannot_see_is_rejected(backend):
    with pytest.raises(ValueError, match="cannot see"):
        COMP[backend](i32([[0, 1]]), i32([0]), i32([7]), i32([[2]]), width=1, ratio=4, entries_per_block=2,
                      pages_per_chunk=K, chunk_rows=CHUNK_ROWS)


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_an_hca_width_shorter_than_the_completed_entries_is_rejected(backend):
    with pytest.raises(ValueError, match="width"):
        COMP[backend](i32([[0, 1, 2, 3]]), i32([0]), i32([31]), None, width=3, ratio=8, entries_per_block=1,
                      pages_per_chunk=K, chunk_rows=CHUNK_ROWS)


WINDOW_BAD = {
    "int64 table": (dict(swa_table=torch.zeros(1, 2, dtype=torch.int64)), "int32"),
    "position past the table": (dict(positions=i32([16])), "positions"),
    "seq past the table": (dict(seq_idx=i32([1])), "seq_idx"),
    "positions shape": (dict(positions=i32([1, 2])), "shape"),
    "zero window": (dict(window=0), "window"),
}


@pytest.mark.parametrize("case", list(WINDOW_BAD))
@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_window_builder_rejects_bad_arguments(backend, case):
    args = dict(swa_table=i32([[0, 1]]), seq_idx=i32([0]), positions=i32([3]), window=W, block_size=BS,
                row_stride=STRIDE)
    change, needle = WINDOW_BAD[case]
    args.update(change)
    with pytest.raises(ValueError, match=needle):
        WINDOW[backend](**args)
