"""swa_write: the torch reference against hand-written loops, Triton (interpreter) against the reference."""

import pytest
import torch
from support.kernels import arena_rows, assert_same_bits, i32, random_rows, random_table

from atom.kernels.swa_write import swa_write, swa_write_ref

BS, STRIDE = 8, 13  # row_stride != block_size on purpose (the fused c4 page is taller than a block)


def naive_swa_write(k, rows, table, seqs, positions, bs, stride):
    for t, (s, p) in enumerate(zip(seqs, positions)):
        if s < 0 or p < 0 or table[s][p // bs] < 0:
            continue
        rows[table[s][p // bs] * stride + p % bs] = k[t]


def test_reference_writes_the_hand_computed_rows():
    buf, rows = arena_rows(40, 2, torch.float32, pitch_extra=0, offset=0)
    table = i32([[2, -1], [0, 1]])
    k = torch.tensor([[1.0, 1.5], [2.0, 2.5], [3.0, 3.5], [4.0, 4.5]])
    # seq 0 pos 3 -> page 2 row 2*13+3 = 29; seq 0 pos 9 -> block 1 = -1 (skipped);
    # seq 1 pos 12 -> page 1 row 13+4 = 17; padding token skipped.
    swa_write_ref(k, rows, table, i32([0, 0, 1, -1]), i32([3, 9, 12, 5]), block_size=BS, row_stride=STRIDE)
    written = (~rows.isnan().all(1)).nonzero().squeeze(1).tolist()
    assert written == [17, 29]
    assert rows[29].tolist() == [1.0, 1.5] and rows[17].tolist() == [3.0, 3.5]


def test_reference_matches_a_naive_loop_on_a_random_batch(gen):
    table = random_table(3, 5, 16, gen)
    positions = torch.randperm(5 * BS, generator=gen)[:18].to(torch.int32)
    seqs = torch.randint(-1, 3, (18,), generator=gen, dtype=torch.int32)
    k = random_rows(18, 6, torch.float32, gen)
    buf, rows = arena_rows(16 * STRIDE, 6, torch.float32)
    want_buf, want = arena_rows(16 * STRIDE, 6, torch.float32)
    swa_write_ref(k, rows, table, seqs, positions, block_size=BS, row_stride=STRIDE)
    naive_swa_write(k, want, table.tolist(), seqs.tolist(), positions.tolist(), BS, STRIDE)
    assert_same_bits(buf, want_buf)
    assert int((~rows.isnan().all(1)).sum()) > 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float8_e4m3fn])
def test_triton_decode_write_equals_the_reference(dtype, gen):
    num_seqs, max_blocks, num_pages, width = 5, 4, 24, 40
    table = random_table(num_seqs, max_blocks, num_pages, gen)
    seqs = torch.arange(num_seqs, dtype=torch.int32).repeat(4)
    positions = torch.randint(0, max_blocks * BS, (seqs.numel(),), generator=gen, dtype=torch.int32)
    positions[:num_seqs] = i32([BS - 1, BS, 2 * BS - 1, 0, 3 * BS])  # block edges
    seqs[-1] = -1  # one padding token
    # unique (seq, position) pairs so every destination row is written once
    keys = seqs.long() * 1000 + positions.long()
    first = torch.tensor([int((keys[:i] == keys[i]).sum()) == 0 for i in range(keys.numel())])
    seqs, positions = seqs[first].contiguous(), positions[first].contiguous()
    k = random_rows(seqs.numel(), width, dtype, gen)
    got_buf, got = arena_rows(num_pages * STRIDE, width, dtype)
    ref_buf, ref = arena_rows(num_pages * STRIDE, width, dtype)
    swa_write(k, got, table, seqs, positions, block_size=BS, row_stride=STRIDE)
    swa_write_ref(k, ref, table, seqs, positions, block_size=BS, row_stride=STRIDE)
    assert_same_bits(got_buf, ref_buf)


@pytest.mark.parametrize("fn", [swa_write, swa_write_ref])
def test_a_missing_page_is_skipped_and_never_falls_back_to_page_zero(fn):
    buf, rows = arena_rows(4 * STRIDE, 3, torch.float32)
    table = i32([[-1, -1, 3]])  # page 0 is not in the table
    k = torch.ones(3, 3)
    fn(k, rows, table, i32([0, 0, 0]), i32([0, 9, 17]), block_size=BS, row_stride=STRIDE)
    assert bool(rows[: 3 * STRIDE].isnan().all())
    assert rows[3 * STRIDE + 1].tolist() == [1.0, 1.0, 1.0]


def _good_args():
    _, rows = arena_rows(4 * STRIDE, 8, torch.float32)
    return dict(k=torch.zeros(2, 8), rows=rows, swa_table=i32([[0, 1], [2, 3]]), seq_idx=i32([0, 1]),
                positions=i32([0, 9]))


BAD_CASES = {
    "k dtype differs from rows": ("k", lambda a: a["k"].double(), "dtype"),
    "k width differs": ("k", lambda a: torch.zeros(2, 7), "width"),
    "k inner dim not contiguous": ("k", lambda a: torch.zeros(2, 16)[:, ::2], "contiguous"),
    "table is int64": ("swa_table", lambda a: a["swa_table"].long(), "int32"),
    "table page past the rows": ("swa_table", lambda a: i32([[0, 1], [2, 4]]), "swa_table"),
    "table below -1": ("swa_table", lambda a: i32([[0, -2], [2, 3]]), "swa_table"),
    "seq_idx past the table": ("seq_idx", lambda a: i32([0, 2]), "seq_idx"),
    "position past the table": ("positions", lambda a: i32([0, 16]), "positions"),
    "positions shape": ("positions", lambda a: i32([0, 1, 2]), "shape"),
}


@pytest.mark.parametrize("case", list(BAD_CASES))
@pytest.mark.parametrize("fn", [swa_write, swa_write_ref], ids=["triton", "torch"])
def test_wrapper_rejects_bad_arguments_before_writing(fn, case):
    args = _good_args()
    name, make, needle = BAD_CASES[case]
    args[name] = make(args)
    before = args["rows"].clone()
    with pytest.raises(ValueError, match=needle):
        fn(args["k"], args["rows"], args["swa_table"], args["seq_idx"], args["positions"], block_size=BS,
           row_stride=STRIDE)
    assert_same_bits(args["rows"], before)


@pytest.mark.parametrize("fn", [swa_write, swa_write_ref], ids=["triton", "torch"])
def test_wrapper_rejects_a_row_stride_smaller_than_the_block(fn):
    args = _good_args()
    with pytest.raises(ValueError, match="row_stride"):
        fn(args["k"], args["rows"], args["swa_table"], args["seq_idx"], args["positions"], block_size=BS,
           row_stride=BS - 1)
