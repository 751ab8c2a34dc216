"""hc_sinkhorn: the reference against the written-out normalisation, Triton (interpreter) against the
reference, the numpy CPU body equal to the reference bit for bit, and the registered op is one op whatever
the iteration count."""

import pytest
import torch

from atom.bench.op_count import OpCounter
from atom.kernels.hc_sinkhorn import hc_sinkhorn, hc_sinkhorn_cpu, hc_sinkhorn_ref


def written_out(comb, iters, eps):
    c = torch.exp(comb - comb.amax(-1, keepdim=True))
    c = c / c.sum(-1, keepdim=True) + eps
    c = c / (c.sum(-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        c = c / (c.sum(-1, keepdim=True) + eps)
        c = c / (c.sum(-2, keepdim=True) + eps)
    return c


def test_reference_follows_softmax_then_alternating_normalisation(gen):
    comb = torch.randn(7, 4, 4, generator=gen, dtype=torch.float64) * 3
    got = hc_sinkhorn_ref(comb.float(), 5, 1e-6)
    torch.testing.assert_close(got.double(), written_out(comb, 5, 1e-6), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("tokens", [1, 16, 37])
def test_triton_equals_the_reference(tokens, gen):
    comb = torch.randn(tokens, 4, 4, generator=gen) * 3
    torch.testing.assert_close(hc_sinkhorn(comb, 20, 1e-6), hc_sinkhorn_ref(comb, 20, 1e-6), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("hc", [1, 2, 4, 8])
@pytest.mark.parametrize("tokens", [0, 1, 3, 32])
def test_the_cpu_body_equals_the_reference_bit_for_bit(hc, tokens, gen):
    for scale in (0.01, 1.0, 6.0, 40.0):  # near-uniform to near-one-hot rows
        comb = torch.randn(tokens, hc, hc, generator=gen) * scale
        for iters, eps in ((1, 1e-6), (20, 1e-6), (7, 0.0), (20, 0.25)):
            assert torch.equal(hc_sinkhorn_cpu(comb, iters, eps), hc_sinkhorn_ref(comb, iters, eps))


def test_the_cpu_body_adds_in_the_references_order():
    # one entry of 1 and three of 2**-24 (half a unit in the last place of 1): added one after another the
    # small ones vanish when they come after the 1 and count when they come first; both placements, in rows
    # and columns, and logits that keep those values through the softmax (rows already summing to 1)
    tiny = 2.0 ** -24
    rows = torch.tensor([[1.0, tiny, tiny, tiny], [tiny, tiny, tiny, 1.0], [tiny, 1.0, tiny, tiny],
                         [tiny, tiny, 1.0, tiny]])
    comb = torch.stack((rows.log(), rows.t().log(), rows.flip(0).log()))
    for iters in (1, 2, 20):
        assert torch.equal(hc_sinkhorn_cpu(comb, iters, 0.0), hc_sinkhorn_ref(comb, iters, 0.0))
        assert torch.equal(hc_sinkhorn_cpu(comb, iters, tiny), hc_sinkhorn_ref(comb, iters, tiny))


def test_the_cpu_body_leaves_its_input_alone_and_returns_a_new_contiguous_tensor(gen):
    comb = torch.randn(5, 4, 4, generator=gen)
    before = comb.clone()
    out = hc_sinkhorn_cpu(comb, 20, 1e-6)
    assert torch.equal(comb, before) and out.is_contiguous() and out.data_ptr() != comb.data_ptr()


def test_the_registered_op_is_one_op_for_any_iteration_count(gen):
    comb = torch.randn(3, 4, 4, generator=gen)
    for iters in (1, 20):
        with OpCounter() as c:
            out = torch.ops.atom.hc_sinkhorn(comb, iters, 1e-6)
        assert c.ops["hc_sinkhorn"] == 1 and c.total == 1
        assert torch.equal(out, hc_sinkhorn_ref(comb, iters, 1e-6))


def test_bad_shapes_and_arguments_are_rejected():
    with pytest.raises(ValueError, match=r"\[T, hc, hc\]"):
        hc_sinkhorn_ref(torch.zeros(2, 4, 3), 3, 1e-6)
    with pytest.raises(ValueError, match="iters"):
        hc_sinkhorn_ref(torch.zeros(2, 4, 4), 0, 1e-6)
    with pytest.raises(ValueError, match="iters"):
        hc_sinkhorn_cpu(torch.zeros(2, 4, 4), 0, 1e-6)
    with pytest.raises(ValueError, match=r"\[T, hc, hc\]"):
        torch.ops.atom.hc_sinkhorn(torch.zeros(2, 4, 3), 3, 1e-6)
    with pytest.raises(ValueError, match="power of two"):
        hc_sinkhorn(torch.zeros(2, 3, 3), 3, 1e-6)
