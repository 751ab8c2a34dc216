"""compressed_write: reference against a naive loop and hand-computed rows; Triton against the reference."""

import pytest
import torch
from support.kernels import arena_rows, assert_same_bits, i32, random_rows, random_table

from atom.kernels.compressed_write import compressed_write, compressed_write_ref

EPB, K, CHUNK_ROWS = 4, 3, 14  # 3 pages of 4 rows per chunk, chunks 14 rows apart (2 rows of other use)


def naive_compressed_write(entries, rows, table, seqs, ents):
    for n, (s, i) in enumerate(zip(seqs, ents)):
        if s < 0 or i < 0:
            continue
        page = table[s][i // EPB]
        if page < 0:
            continue
        rows[(page // K) * CHUNK_ROWS + (page % K) * EPB + i % EPB] = entries[n]


def test_reference_writes_the_hand_computed_rows():
    _, rows = arena_rows(3 * CHUNK_ROWS, 1, torch.float32)
    table = i32([[4, -1, 0]])
    # entry 1 -> page 4 = chunk 1, local page 1, slot 1: row 14 + 4 + 1 = 19
    # entry 6 -> block 1 = -1 (skipped); entry 11 -> page 0, slot 3: row 3
    compressed_write_ref(torch.tensor([[1.0], [2.0], [3.0]]), rows, table, i32([0, 0, 0]), i32([1, 6, 11]),
                         entries_per_block=EPB, pages_per_chunk=K, chunk_rows=CHUNK_ROWS)
    assert (~rows.isnan()).squeeze(1).nonzero().squeeze(1).tolist() == [3, 19]
    assert rows[19].item() == 1.0 and rows[3].item() == 3.0


def test_reference_matches_a_naive_loop(gen):
    table = random_table(3, 4, 15, gen)
    seqs = torch.arange(3, dtype=torch.int32).repeat_interleave(8)
    ents = torch.stack([torch.randperm(16, generator=gen)[:8] for _ in range(3)]).flatten().to(torch.int32)
    seqs[5] = -1
    entries = random_rows(24, 5, torch.float32, gen)
    buf, rows = arena_rows(5 * CHUNK_ROWS, 5, torch.float32)
    want_buf, want = arena_rows(5 * CHUNK_ROWS, 5, torch.float32)
    compressed_write_ref(entries, rows, table, seqs, ents, entries_per_block=EPB, pages_per_chunk=K,
                         chunk_rows=CHUNK_ROWS)
    naive_compressed_write(entries, want, table.tolist(), seqs.tolist(), ents.tolist())
    assert_same_bits(buf, want_buf)
    assert int((~rows.isnan().all(1)).sum()) > 0


@pytest.mark.parametrize("dtype,width", [(torch.float32, 24), (torch.bfloat16, 16), (torch.uint8, 132)])
def test_triton_write_equals_the_reference(dtype, width, gen):
    """Main rows (float), indexer keys (bytes, 132 B like an fp8 key + scale): same formula, own view."""
    num_seqs, max_blocks, chunks = 4, 5, 8
    table = random_table(num_seqs, max_blocks, chunks * K, gen)
    ents = torch.stack([torch.randperm(max_blocks * EPB, generator=gen)[:9] for _ in range(num_seqs)])
    seqs = torch.arange(num_seqs, dtype=torch.int32).repeat_interleave(9)
    ents = ents.flatten().to(torch.int32)
    ents[3] = -1  # padding entry
    entries = random_rows(seqs.numel(), width, dtype, gen)
    got_buf, got = arena_rows(chunks * CHUNK_ROWS, width, dtype)
    ref_buf, ref = arena_rows(chunks * CHUNK_ROWS, width, dtype)
    kw = dict(entries_per_block=EPB, pages_per_chunk=K, chunk_rows=CHUNK_ROWS)
    compressed_write(entries, got, table, seqs, ents, **kw)
    compressed_write_ref(entries, ref, table, seqs, ents, **kw)
    assert_same_bits(got_buf, ref_buf)


@pytest.mark.parametrize("fn", [compressed_write, compressed_write_ref], ids=["triton", "torch"])
def test_a_missing_page_is_skipped_and_never_falls_back_to_page_zero(fn):
    _, rows = arena_rows(2 * CHUNK_ROWS, 2, torch.float32)
    fn(torch.ones(2, 2), rows, i32([[-1, 5]]), i32([0, 0]), i32([2, 4]), entries_per_block=EPB,
       pages_per_chunk=K, chunk_rows=CHUNK_ROWS)
    assert bool(rows[:CHUNK_ROWS].isnan().all())
    assert rows[CHUNK_ROWS + 2 * EPB].tolist() == [1.0, 1.0]


BAD = {
    "entries dtype": (dict(entries=torch.zeros(2, 4, dtype=torch.float64)), "dtype"),
    "entries width": (dict(entries=torch.zeros(2, 3)), "width"),
    "table int64": (dict(comp_table=torch.zeros(1, 2, dtype=torch.int64)), "int32"),
    "page past the rows": (dict(comp_table=i32([[0, 6]])), "comp_table"),
    "entry past the table": (dict(entry_idx=i32([0, 8])), "entry_idx"),
    "seq past the table": (dict(seq_idx=i32([0, 1])), "seq_idx"),
    "chunk smaller than its pages": (dict(chunk_rows=K * EPB - 1), "chunk_rows"),
    "non-contiguous index": (dict(seq_idx=i32([0, 0, 0, 0])[::2]), "contiguous"),
}


@pytest.mark.parametrize("case", list(BAD))
@pytest.mark.parametrize("fn", [compressed_write, compressed_write_ref], ids=["triton", "torch"])
def test_wrapper_rejects_bad_arguments_before_writing(fn, case):
    _, rows = arena_rows(2 * CHUNK_ROWS, 4, torch.float32)  # 6 pages
    args = dict(entries=torch.zeros(2, 4), rows=rows, comp_table=i32([[0, 5]]), seq_idx=i32([0, 0]),
                entry_idx=i32([0, 7]), entries_per_block=EPB, pages_per_chunk=K, chunk_rows=CHUNK_ROWS)
    change, needle = BAD[case]
    args.update(change)
    before = rows.clone()
    with pytest.raises(ValueError, match=needle):
        fn(args.pop("entries"), args.pop("rows"), args.pop("comp_table"), args.pop("seq_idx"),
           args.pop("entry_idx"), **args)
    assert_same_bits(rows, before)
