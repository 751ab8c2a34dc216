"""FP8 byte rows in the write and read kernels: writers store exactly the codec's bytes at the right rows,
attention and indexer scores over byte rows equal those over their decoded values, Triton equals the references."""

import pytest
import torch
from support.kernels import arena_rows, assert_same_bits, assert_within_bf16_probability_rounding, i32, random_table

from atom.kernels.compressed_write import compressed_write, compressed_write_ref
from atom.kernels.fp8_ds_mla import Fp8DsMlaLayout, fp8_ds_mla_dequantize_ref, fp8_ds_mla_quantize_ref
from atom.kernels.fp8_index_key import Fp8IndexKeyLayout, fp8_index_key_quantize_ref
from atom.kernels.index_score import index_score, index_score_ref
from atom.kernels.sparse_attention import sparse_attention, sparse_attention_ref
from atom.kernels.swa_write import swa_write, swa_write_ref
from atom.models.deepseek_v4.indexer import Indexer

ROW = Fp8DsMlaLayout(nope=24, rope=8, qblock=8)  # the tiny model: 24 + 16 + 3 -> 48 bytes
KEY = Fp8IndexKeyLayout(dim=16)  # 16 + 4 = 20 bytes
BS, STRIDE = 8, 13
EPB, K, CHUNK_ROWS = 4, 3, 14


def values(n, dim, gen, dtype=torch.float32):
    return (torch.randn(n, dim, generator=gen) * torch.logspace(-3, 3, n)[:, None]).to(dtype)


def test_swa_write_reference_stores_the_codec_bytes_at_the_hand_computed_rows(gen):
    _, rows = arena_rows(4 * STRIDE, ROW.row_bytes, torch.uint8)
    k = values(3, ROW.dim, gen)
    # seq 0 pos 3 -> page 2 row 29; seq 0 pos 9 -> no page; seq 1 pos 12 -> page 1 row 17
    swa_write_ref(k, rows, i32([[2, -1], [0, 1]]), i32([0, 0, 1]), i32([3, 9, 12]), block_size=BS,
                  row_stride=STRIDE, codec=ROW)
    codes = fp8_ds_mla_quantize_ref(k, layout=ROW)
    assert (rows != 0xFF).any(1).nonzero().squeeze(1).tolist() == [17, 29]
    assert_same_bits(rows[29], codes[0])
    assert_same_bits(rows[17], codes[2])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_swa_writes_of_fp8_rows_equal_the_reference(dtype, gen):
    table = random_table(4, 6, 30, gen)
    seqs = torch.arange(4, dtype=torch.int32).repeat_interleave(5)
    positions = torch.stack([torch.randperm(6 * BS, generator=gen)[:5] for _ in range(4)]).flatten().to(torch.int32)
    seqs[3] = -1
    k = values(seqs.numel(), ROW.dim, gen, dtype)
    got_buf, got = arena_rows(30 * STRIDE, ROW.row_bytes, torch.uint8)
    ref_buf, ref = arena_rows(30 * STRIDE, ROW.row_bytes, torch.uint8)
    kw = dict(block_size=BS, row_stride=STRIDE, codec=ROW)
    swa_write(k, got, table, seqs, positions, **kw)
    swa_write_ref(k, ref, table, seqs, positions, **kw)
    assert_same_bits(got_buf, ref_buf)
    assert int((ref != 0xFF).any(1).sum()) > 0


@pytest.mark.parametrize("codec", [ROW, KEY], ids=["fp8_ds_mla", "fp8_index_key"])
def test_compressed_write_of_byte_rows_stores_the_codec_bytes_and_triton_agrees(codec, gen):
    quant = fp8_ds_mla_quantize_ref if codec is ROW else fp8_index_key_quantize_ref
    table = i32([[4, -1, 0], [1, 2, 3]])
    seqs, ents = i32([0, 0, 0, 1, 1]), i32([1, 6, 11, 0, 9])
    dim = codec.dim
    entries = values(5, dim, gen)
    got_buf, got = arena_rows(3 * CHUNK_ROWS, codec.row_bytes, torch.uint8)
    ref_buf, ref = arena_rows(3 * CHUNK_ROWS, codec.row_bytes, torch.uint8)
    kw = dict(entries_per_block=EPB, pages_per_chunk=K, chunk_rows=CHUNK_ROWS, codec=codec)
    compressed_write_ref(entries, ref, table, seqs, ents, **kw)
    compressed_write(entries, got, table, seqs, ents, **kw)
    assert_same_bits(got_buf, ref_buf)
    # entry 1 of seq 0 -> page 4 (chunk 1, page 1, slot 1) = row 19; entry 11 -> page 0 slot 3 = row 3;
    # seq 1: entry 0 -> page 1 slot 0 = row 4; entry 9 -> page 3 (chunk 1, page 0) slot 1 = row 15
    codes = quant(entries, layout=codec)
    assert (ref != 0xFF).any(1).nonzero().squeeze(1).tolist() == [3, 4, 15, 19]
    for row, n in ((19, 0), (3, 2), (4, 3), (15, 4)):
        assert_same_bits(ref[row], codes[n])


def attention_inputs(gen, tokens=6, heads=5, n_rows=40, offset=7, pitch_extra=3):
    _, rows = arena_rows(n_rows, ROW.row_bytes, torch.uint8, offset=offset, pitch_extra=pitch_extra)
    rows.copy_(fp8_ds_mla_quantize_ref(values(n_rows, ROW.dim, gen), layout=ROW))
    q = torch.randn(tokens, heads, ROW.dim, generator=gen)
    widx = torch.randint(-1, n_rows, (tokens, 9), generator=gen, dtype=torch.int32)
    cidx = torch.randint(-1, n_rows, (tokens, 4), generator=gen, dtype=torch.int32)
    return q, rows, widx, cidx, torch.randn(heads, generator=gen)


def test_attention_over_fp8_rows_is_attention_over_their_decoded_values(gen):
    q, rows, widx, cidx, sink = attention_inputs(gen)
    decoded = fp8_ds_mla_dequantize_ref(rows, out_dtype=torch.float32, layout=ROW)
    got = sparse_attention_ref(q, rows, widx, rows, cidx, sink, scale=0.3, codec=ROW)
    assert_same_bits(got, sparse_attention_ref(q, decoded, widx, decoded, cidx, sink, scale=0.3))


ROW_PLACES = pytest.mark.parametrize("offset,pitch_extra", [(7, 3), (8, 2)],
                                     ids=["odd-rows-rope-by-bytes", "even-rows-rope-as-bf16"])


@ROW_PLACES
@pytest.mark.parametrize("with_comp", [True, False])
def test_triton_attention_over_fp8_rows_matches_the_reference(with_comp, offset, pitch_extra, gen):
    q, rows, widx, cidx, sink = attention_inputs(gen, offset=offset, pitch_extra=pitch_extra)
    comp = (rows, cidx) if with_comp else (None, None)
    got = sparse_attention(q, rows, widx, *comp, sink, scale=0.3, codec=ROW)
    want = sparse_attention_ref(q, rows, widx, *comp, sink, scale=0.3, codec=ROW)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))


@ROW_PLACES
@pytest.mark.parametrize("tokens,heads", [(6, 5), (1, 64), (3, 20)], ids=["ragged", "one-token-64-heads", "20-heads"])
def test_triton_attention_of_bf16_queries_over_fp8_rows_is_within_the_probability_rounding(
        tokens, heads, offset, pitch_extra, gen):
    q, rows, widx, cidx, sink = attention_inputs(gen, tokens=tokens, heads=heads, offset=offset,
                                                 pitch_extra=pitch_extra)
    q = q.to(torch.bfloat16)
    got = sparse_attention(q, rows, widx, rows, cidx, sink, scale=0.3, codec=ROW)
    want = sparse_attention_ref(q, rows, widx, rows, cidx, sink, scale=0.3, codec=ROW)
    decoded = fp8_ds_mla_dequantize_ref(rows, out_dtype=torch.float32, layout=ROW)
    assert_within_bf16_probability_rounding(got, want, decoded)


def test_unwritten_nan_bytes_are_never_read_through_a_masked_index(gen):
    q, rows, widx, cidx, sink = attention_inputs(gen)
    rows[0] = 0xFF  # NaN in every decoded dim; index -1 is clamped to row 0 by the reference's gather
    for fn in (sparse_attention, sparse_attention_ref):
        out = fn(q, rows, torch.where(widx == 0, -1, widx), rows, torch.where(cidx == 0, -1, cidx), sink, scale=0.3,
                 codec=ROW)
        assert not bool(out.isnan().any())


@pytest.mark.parametrize("fn", [swa_write, swa_write_ref])
def test_writers_reject_values_of_the_wrong_width_or_a_missing_codec(fn):
    _, rows = arena_rows(2 * STRIDE, ROW.row_bytes, torch.uint8)
    args = (i32([[0]]), i32([0]), i32([1]))
    with pytest.raises(ValueError, match="width"):
        fn(torch.zeros(1, 30), rows, *args, block_size=BS, row_stride=STRIDE, codec=ROW)
    with pytest.raises(ValueError, match="dtype"):
        fn(torch.zeros(1, ROW.dim), rows, *args, block_size=BS, row_stride=STRIDE)
    with pytest.raises(ValueError, match="codec"):
        fn(torch.zeros(1, ROW.dim), rows, *args, block_size=BS, row_stride=STRIDE, codec="fp8")


def test_attention_rejects_byte_rows_whose_values_do_not_match_q():
    _, rows = arena_rows(4, ROW.row_bytes, torch.uint8)
    with pytest.raises(ValueError, match="q has 16 dims"):
        sparse_attention_ref(torch.zeros(1, 2, 16), rows, i32([[0]]), None, None, torch.zeros(2), scale=0.5,
                             codec=ROW)


def index_inputs(gen, codec, tokens=7, heads=4, n_rows=50, width=70):
    keys = fp4_like_keys(n_rows, gen)
    if codec is None:
        _, rows = arena_rows(n_rows, KEY.dim, torch.float32)
        rows.copy_(keys)
    else:
        _, rows = arena_rows(n_rows, KEY.row_bytes, torch.uint8)
        rows.copy_(fp8_index_key_quantize_ref(keys, layout=KEY))
    q = torch.randn(tokens, heads, KEY.dim, generator=gen)
    w = torch.randn(tokens, heads, generator=gen)
    idx = torch.randint(-1, n_rows, (tokens, width), generator=gen, dtype=torch.int32)
    return q, w, rows, idx, keys


def fp4_like_keys(n, gen):
    """Keys on the FP4 grid times a power of two, as the indexer's quant_sim round-trip leaves them."""
    grid = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    pick = grid[torch.randint(0, 8, (n, KEY.dim), generator=gen)]
    sign = torch.where(torch.rand(n, KEY.dim, generator=gen) < 0.5, -1.0, 1.0)
    return pick * sign * 2.0 ** torch.randint(-6, 4, (n, 1), generator=gen).float()


@pytest.mark.parametrize("codec", [None, KEY], ids=["fp32", "fp8"])
def test_index_score_reference_is_the_indexers_expression_per_query(codec, gen):
    q, w, rows, idx, keys = index_inputs(gen, codec)
    got = index_score_ref(q, w, rows, idx, codec=codec)
    for t in range(idx.shape[0]):
        valid = idx[t] >= 0
        want = Indexer.score(q[t], w[t], keys[idx[t, valid].long()])  # FP4-grid keys survive FP8 exactly
        assert_same_bits(got[t, valid], want)
        assert bool((got[t, ~valid] == float("-inf")).all())


@pytest.mark.parametrize("codec", [None, KEY], ids=["fp32", "fp8"])
def test_triton_index_score_matches_the_reference(codec, gen):
    q, w, rows, idx, _ = index_inputs(gen, codec)
    got = index_score(q, w, rows, idx, codec=codec)
    want = index_score_ref(q, w, rows, idx, codec=codec)
    assert torch.equal(got.isinf(), want.isinf())
    finite = ~want.isinf()
    torch.testing.assert_close(got[finite], want[finite], rtol=1e-5, atol=1e-5 * float(want[finite].abs().max()))


@pytest.mark.parametrize("codec", [None, KEY], ids=["bf16-keys", "fp8-keys"])
@pytest.mark.parametrize("tokens,heads,width", [(7, 4, 70), (1, 64, 33), (3, 20, 129)],
                         ids=["ragged", "one-token-64-heads", "heads-past-a-tile"])
def test_triton_index_score_on_bf16_tensor_cores_matches_the_reference(codec, tokens, heads, width, gen):
    """bf16 queries with bf16 or FP8 keys take the bf16 dot; both operands are exact in bf16, so only the
    fp32 summation order differs from the reference (same tolerance as fp32)."""
    q, w, rows, idx, _ = index_inputs(gen, codec, tokens=tokens, heads=heads, width=width)
    q, w = q.to(torch.bfloat16), w.to(torch.bfloat16)
    if codec is None:
        rows = rows.to(torch.bfloat16)
    got = index_score(q, w, rows, idx, codec=codec)
    want = index_score_ref(q, w, rows, idx, codec=codec)
    assert torch.equal(got.isinf(), want.isinf())
    finite = ~want.isinf()
    torch.testing.assert_close(got[finite], want[finite], rtol=1e-5, atol=1e-5 * float(want[finite].abs().max()))


def test_index_score_rejects_keys_of_another_width(gen):
    q, w, rows, idx, _ = index_inputs(gen, KEY)
    with pytest.raises(ValueError, match="q has 8 dims"):
        index_score_ref(q[:, :, :8].contiguous(), w, rows, idx, codec=KEY)
