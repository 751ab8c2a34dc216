"""Property tests: Triton equals the reference over random geometries (block size, row stride, chunk packing,
window, ragged lengths). Few examples each: every example runs the interpreter."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from support.kernels import arena_rows, assert_same_bits, random_rows, random_table

from atom.kernels.compressed_write import compressed_write, compressed_write_ref
from atom.kernels.compressor_state import compressor_state_update, compressor_state_update_ref
from atom.kernels.paged_index import build_window_index, build_window_index_ref
from atom.kernels.swa_write import ragged_tokens, swa_write, swa_write_ref

FEW = settings(max_examples=25, deadline=None, derandomize=True)


@st.composite
def ragged_batches(draw, max_pos):
    n = draw(st.integers(1, 4))
    lens = [draw(st.integers(1, 24))] + draw(st.lists(st.integers(0, 24), min_size=n - 1, max_size=n - 1))
    starts = [draw(st.integers(0, max_pos - ln)) for ln in lens]
    cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32)
    return cu, torch.tensor(starts, dtype=torch.int32)


@FEW
@given(bs=st.sampled_from([4, 8, 16]), extra=st.integers(0, 9), seed=st.integers(0, 2**16), data=st.data())
def test_swa_write_of_ragged_chunks_matches_the_reference_for_any_geometry(bs, extra, seed, data):
    gen = torch.Generator().manual_seed(seed)
    max_blocks = 40 // bs + 1
    cu, starts = data.draw(ragged_batches(max_blocks * bs))
    num_seqs = starts.numel()
    pages = num_seqs * max_blocks + 3
    table = random_table(num_seqs, max_blocks, pages, gen)
    k = random_rows(int(cu[-1]), 8, torch.float32, gen)
    got_buf, got = arena_rows(pages * (bs + extra), 8, torch.float32)
    ref_buf, ref = arena_rows(pages * (bs + extra), 8, torch.float32)
    _, seq, pos, _ = ragged_tokens(cu, starts, None, int(cu[-1]))  # every token of every chunk, as the runner flattens them
    kw = dict(block_size=bs, row_stride=bs + extra)
    swa_write(k, got, table, seq.to(torch.int32), pos.to(torch.int32), **kw)
    swa_write_ref(k, ref, table, seq.to(torch.int32), pos.to(torch.int32), **kw)
    assert_same_bits(got_buf, ref_buf)


@FEW
@given(epb=st.sampled_from([1, 2, 4, 32]), k=st.integers(1, 7), extra=st.integers(0, 5), seed=st.integers(0, 2**16))
def test_compressed_write_matches_the_reference_for_any_chunk_packing(epb, k, extra, seed):
    gen = torch.Generator().manual_seed(seed)
    chunk_rows = k * epb + extra
    num_seqs, max_blocks = 3, 3
    chunks = -(-num_seqs * max_blocks // k) + 1
    table = random_table(num_seqs, max_blocks, chunks * k, gen)
    n = num_seqs * max_blocks * epb
    seqs = torch.arange(num_seqs, dtype=torch.int32).repeat_interleave(max_blocks * epb)
    ents = torch.arange(max_blocks * epb, dtype=torch.int32).repeat(num_seqs)
    keep = torch.rand(n, generator=gen) < 0.6
    seqs, ents = seqs[keep].contiguous(), ents[keep].contiguous()
    entries = random_rows(seqs.numel(), 6, torch.bfloat16, gen)
    got_buf, got = arena_rows(chunks * chunk_rows, 6, torch.bfloat16)
    ref_buf, ref = arena_rows(chunks * chunk_rows, 6, torch.bfloat16)
    kw = dict(entries_per_block=epb, pages_per_chunk=k, chunk_rows=chunk_rows)
    compressed_write(entries, got, table, seqs, ents, **kw)
    compressed_write_ref(entries, ref, table, seqs, ents, **kw)
    assert_same_bits(got_buf, ref_buf)


@FEW
@given(ring=st.sampled_from([4, 8, 16]), seed=st.integers(0, 2**16), data=st.data())
def test_ring_update_matches_the_reference_for_any_ragged_batch(ring, seed, data):
    gen = torch.Generator().manual_seed(seed)
    cu, starts = data.draw(ragged_batches(100))
    num_seqs = starts.numel()
    n = int(cu[-1])
    kv, score = random_rows(n, 5, torch.float32, gen), random_rows(n, 5, torch.float32, gen)
    ape = random_rows(4, 5, torch.float32, gen)
    slots = torch.randperm(num_seqs + 1, generator=gen)[:num_seqs].to(torch.int32) - 1  # one may be -1
    got = [torch.full((num_seqs + 1, ring, 5), float("nan")) for _ in range(2)]
    ref = [t.clone() for t in got]
    compressor_state_update(kv, score, ape, *got, slots, cu, starts)
    compressor_state_update_ref(kv, score, ape, *ref, slots, cu, starts)
    assert_same_bits(got[0], ref[0])
    assert_same_bits(got[1], ref[1])


@FEW
@given(bs=st.sampled_from([4, 8, 16]), extra=st.integers(0, 9), window=st.integers(1, 40), seed=st.integers(0, 2**16))
def test_window_index_matches_the_reference_for_any_geometry(bs, extra, window, seed):
    gen = torch.Generator().manual_seed(seed)
    max_blocks = 64 // bs
    table = random_table(3, max_blocks, 3 * max_blocks + 2, gen)
    seqs = torch.randint(-1, 3, (30,), generator=gen, dtype=torch.int32)
    positions = torch.randint(0, max_blocks * bs, (30,), generator=gen, dtype=torch.int32)
    kw = dict(window=window, block_size=bs, row_stride=bs + extra)
    got = build_window_index(table, seqs, positions, **kw)
    assert_same_bits(got, build_window_index_ref(table, seqs, positions, **kw))
