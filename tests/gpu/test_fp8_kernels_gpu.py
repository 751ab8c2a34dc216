"""Compiled Triton kernels on fp8 byte rows against the torch references, at real DSV4-Flash row geometry
(584-byte fp8_ds_mla rows, 132-byte FP8 indexer keys). Skipped without CUDA/ROCm; run alone (``pytest tests/gpu``)."""


import pytest
import torch

from atom.kernels.fp8_ds_mla import DSV4_LAYOUT
from atom.kernels.fp8_index_key import DSV4_INDEX_LAYOUT
from support.gpu import gpu_module_marks

pytestmark = gpu_module_marks("tests/kernels/test_kernel_fp8_rows.py covers the same kernels in the interpreter")

DEV = "cuda"
BS, ROW_STRIDE, WINDOW, H = 128, 224, 128, 64
D = DSV4_LAYOUT.dim



@pytest.fixture
def gen():
    return torch.Generator().manual_seed(11)


def byte_rows(n, width):
    return torch.full((n, width), 0xFF, dtype=torch.uint8, device=DEV)


def rand_table(num_seqs, max_blocks, num_pages, gen):
    pages = torch.randperm(num_pages, generator=gen)[:num_seqs * max_blocks].view(num_seqs, max_blocks)
    pages[torch.rand(num_seqs, max_blocks, generator=gen) < 0.2] = -1
    return pages.to(torch.int32).to(DEV)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fp8_swa_writes_equal_the_references(dtype, gen):
    from atom.kernels.swa_write import swa_write, swa_write_ref

    tab = rand_table(64, 8, 512, gen)
    k = (torch.randn(64, D, generator=gen) * 10).to(dtype).to(DEV)
    seq = torch.arange(64, dtype=torch.int32, device=DEV)
    pos = torch.randint(0, 8 * BS, (64,), generator=gen, dtype=torch.int32).to(DEV)
    a, b = byte_rows(512 * ROW_STRIDE, 584), byte_rows(512 * ROW_STRIDE, 584)
    kw = dict(block_size=BS, row_stride=ROW_STRIDE, codec=DSV4_LAYOUT)
    swa_write(k, a, tab, seq, pos, **kw)
    swa_write_ref(k, b, tab, seq, pos, **kw)
    assert torch.equal(a, b)


@pytest.mark.parametrize("codec", [DSV4_LAYOUT, DSV4_INDEX_LAYOUT], ids=["fp8_ds_mla", "fp8_index_key"])
def test_fp8_compressed_writes_equal_the_reference(codec, gen):
    from atom.kernels.compressed_write import compressed_write, compressed_write_ref

    tab = rand_table(8, 32, 512, gen)
    seq = torch.arange(8, dtype=torch.int32).repeat_interleave(100).to(DEV)
    ent = torch.cat([torch.randperm(1024, generator=gen)[:100] for _ in range(8)]).to(torch.int32).to(DEV)
    entries = torch.randn(800, codec.dim, generator=gen).to(DEV)
    a, b = byte_rows(512 * 32, codec.row_bytes), byte_rows(512 * 32, codec.row_bytes)
    kw = dict(entries_per_block=32, pages_per_chunk=7, chunk_rows=224, codec=codec)
    compressed_write(entries, a, tab, seq, ent, **kw)
    compressed_write_ref(entries, b, tab, seq, ent, **kw)
    assert torch.equal(a, b)


def test_fp8_index_key_codec_equals_the_reference(gen):
    from atom.kernels.fp8_index_key import (fp8_index_key_dequantize, fp8_index_key_dequantize_ref,
                                            fp8_index_key_quantize, fp8_index_key_quantize_ref)

    x = (torch.randn(1000, 128, generator=gen) * torch.logspace(-5, 4, 1000)[:, None]).to(DEV)
    got = fp8_index_key_quantize(x)
    assert torch.equal(got, fp8_index_key_quantize_ref(x))
    assert torch.equal(fp8_index_key_dequantize(got).view(torch.int32), fp8_index_key_dequantize_ref(got).view(torch.int32))


@pytest.mark.parametrize("num_tokens", [1, 64])
def test_sparse_attention_over_fp8_rows_equals_the_reference(num_tokens, gen):
    from atom.kernels.fp8_ds_mla import fp8_ds_mla_quantize_ref
    from atom.kernels.sparse_attention import sparse_attention, sparse_attention_ref

    q = torch.randn(num_tokens, H, D, generator=gen).to(torch.bfloat16).to(DEV)
    wrows = fp8_ds_mla_quantize_ref(torch.randn(4096, D, generator=gen).to(DEV))
    crows = fp8_ds_mla_quantize_ref(torch.randn(8192, D, generator=gen).to(DEV))
    widx = torch.randint(-1, 4096, (num_tokens, WINDOW), generator=gen, dtype=torch.int32).to(DEV)
    cidx = torch.randint(-1, 8192, (num_tokens, 512), generator=gen, dtype=torch.int32).to(DEV)
    sink = torch.randn(H, generator=gen).to(DEV)
    kw = dict(scale=D ** -0.5, codec=DSV4_LAYOUT)
    got = sparse_attention(q, wrows, widx, crows, cidx, sink, **kw)
    ref = sparse_attention_ref(q, wrows, widx, crows, cidx, sink, **kw)
    torch.testing.assert_close(got.float(), ref.float(), rtol=1e-2, atol=1e-2)


def test_index_score_over_fp8_keys_equals_the_reference(gen):
    from atom.kernels.fp8_index_key import fp8_index_key_quantize_ref
    from atom.kernels.index_score import index_score, index_score_ref

    keys = fp8_index_key_quantize_ref(torch.randn(4096, 128, generator=gen).to(DEV))
    q = torch.randn(16, 64, 128, generator=gen).to(DEV)
    w = torch.randn(16, 64, generator=gen).to(DEV)
    idx = torch.randint(-1, 4096, (16, 2048), generator=gen, dtype=torch.int32).to(DEV)
    got = index_score(q, w, keys, idx, codec=DSV4_INDEX_LAYOUT)
    ref = index_score_ref(q, w, keys, idx, codec=DSV4_INDEX_LAYOUT)
    assert torch.equal(got.isinf(), ref.isinf())
    finite = ~ref.isinf()
    torch.testing.assert_close(got[finite], ref[finite], rtol=1e-4, atol=1e-3)
