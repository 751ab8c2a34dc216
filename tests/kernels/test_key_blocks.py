"""Fixed key blocks (atom.kernels.key_blocks): inside the scope, the sparse attention and indexer score references
give one query the same bits however wide its index list is padded with -1 entries and whatever other queries
share the call, and still compute the contract's values."""


import torch

from atom.kernels.index_score import index_score, index_score_ref
from atom.kernels.key_blocks import KEY_BLOCK, block_partial_sums, block_scores, fixed_key_blocks, key_blocks_on
from atom.kernels.sparse_attention import sparse_attention_ref

H, D = 4, 16


def _rows(n: int, gen: torch.Generator) -> torch.Tensor:
    return torch.randn(n, D, generator=gen)


def _list(real: list[int], width: int) -> torch.Tensor:
    """One query's index list: ``real`` then -1 up to ``width``."""
    return torch.tensor([real + [-1] * (width - len(real))], dtype=torch.int32)


def _attend(q, wrows, widx, crows, cidx, sink):
    return sparse_attention_ref(q, wrows, widx, crows, cidx, sink, scale=0.25)


def test_a_querys_attention_has_the_same_bits_however_wide_its_compressed_list_is_padded(gen):
    wrows, crows, sink = _rows(8, gen), _rows(200, gen), torch.randn(H, generator=gen)
    q = torch.randn(1, H, D, generator=gen)
    widx = torch.tensor([[0, 3, 5, -1, 7, 2, -1, 1]], dtype=torch.int32)
    real = torch.randperm(200, generator=gen)[:70].sort().values.tolist()  # spans two blocks
    with fixed_key_blocks():
        outs = [_attend(q, wrows, widx, crows, _list(real, w), sink) for w in (70, 72, 128, 200, 512)]
    for out in outs[1:]:
        assert torch.equal(out, outs[0])


def test_a_querys_attention_has_the_same_bits_alone_and_beside_other_queries(gen):
    wrows, crows, sink = _rows(8, gen), _rows(64, gen), torch.randn(H, generator=gen)
    q = torch.randn(5, H, D, generator=gen)
    widx = torch.randint(-1, 8, (5, 8), generator=gen, dtype=torch.int32)
    cidx = torch.randint(0, 64, (5, 40), generator=gen, dtype=torch.int32)
    cidx[2, 4:] = -1  # the query compared: 4 real entries in a list widened by its neighbours
    with fixed_key_blocks():
        together = _attend(q, wrows, widx, crows, cidx, sink)
        alone = _attend(q[2:3], wrows, widx[2:3], crows, cidx[2:3, :4], sink)
    assert torch.equal(together[2:3], alone)


def test_attention_over_fixed_key_blocks_matches_a_float64_softmax_with_the_sink(gen):
    wrows, crows, sink = _rows(8, gen), _rows(300, gen), torch.randn(H, generator=gen)
    q = torch.randn(2, H, D, generator=gen)
    widx = torch.randint(-1, 8, (2, 8), generator=gen, dtype=torch.int32)
    cidx = torch.randint(-1, 300, (2, 150), generator=gen, dtype=torch.int32)  # three blocks, masked slots inside
    with fixed_key_blocks():
        got = _attend(q, wrows, widx, crows, cidx, sink)
    want = torch.zeros(2, H, D, dtype=torch.float64)
    for t in range(2):
        keys = [wrows[i] for i in widx[t].tolist() if i >= 0] + [crows[i] for i in cidx[t].tolist() if i >= 0]
        k = torch.stack(keys).double()
        s = 0.25 * q[t].double() @ k.T  # [H, K]
        e = torch.exp(s)
        want[t] = (e @ k) / (e.sum(-1) + torch.exp(sink.double()))[:, None]
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-6)
    plain = _attend(q, wrows, widx, crows, cidx, sink)  # outside the scope: the whole-list arithmetic
    torch.testing.assert_close(got, plain, rtol=1e-5, atol=1e-6)


def test_a_querys_indexer_scores_have_the_same_bits_however_wide_its_candidate_list_is(gen):
    keys = _rows(100, gen)
    q, w = torch.randn(1, H, D, generator=gen), torch.randn(1, H, generator=gen)
    real = list(range(0, 56, 7))  # 8 candidates
    with fixed_key_blocks():
        scores = [index_score_ref(q, w, keys, _list(real, n), w_scale=0.5) for n in (8, 16, 32, 64, 130)]
    for got, n in zip(scores, (8, 16, 32, 64, 130)):
        assert torch.equal(got[:, :8], scores[0])
        assert bool((got[:, 8:] == float("-inf")).all()) and got.shape == (1, n)
    want = (torch.relu(q[0].double() @ keys[real].double().T) * (w[0].double() * 0.5)[:, None]).sum(0)
    torch.testing.assert_close(scores[0][0].double(), want, rtol=1e-5, atol=1e-6)


def test_block_helpers_give_the_whole_list_products_and_sums(gen):
    q, keys = torch.randn(3, H, D, generator=gen), torch.randn(3, KEY_BLOCK + 5, D, generator=gen)
    p = torch.rand(3, H, KEY_BLOCK + 5, generator=gen)
    torch.testing.assert_close(block_scores(q, keys), q @ keys.transpose(1, 2), rtol=1e-6, atol=1e-5)
    total, weighted = block_partial_sums(p, keys)
    torch.testing.assert_close(total, p.sum(-1), rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(weighted, p @ keys, rtol=1e-6, atol=1e-5)


def test_the_scope_is_off_by_default_and_restored_when_it_ends():
    assert not key_blocks_on()
    with fixed_key_blocks():
        assert key_blocks_on()
        with fixed_key_blocks(False):
            assert not key_blocks_on()
        assert key_blocks_on()
    assert not key_blocks_on()


def test_the_triton_indexer_scores_a_candidate_alike_however_its_list_is_padded_and_whatever_else_is_scored(gen):
    rows = _rows(300, gen)
    q, w = torch.randn(3, H, D, generator=gen), torch.randn(3, H, generator=gen)
    idx = torch.randint(0, 300, (3, 150), generator=gen, dtype=torch.int32)
    alone = index_score(q[:1], w[:1], rows, idx[:1])
    padded = index_score(q[:1], w[:1], rows, torch.cat([idx[:1], torch.full((1, 250), -1, dtype=torch.int32)], 1))
    in_company = index_score(q, w, rows, idx)
    assert torch.equal(padded[:, :150], alone) and torch.equal(in_company[:1], alone)
    assert bool((padded[:, 150:] == float("-inf")).all())
    torch.testing.assert_close(alone, index_score_ref(q[:1], w[:1], rows, idx[:1]), rtol=2e-5, atol=2e-5)
