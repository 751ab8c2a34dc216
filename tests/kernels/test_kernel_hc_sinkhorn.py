"""hc_sinkhorn: the reference against the written-out normalisation, Triton (interpreter) against the
reference, and the registered op is one op whatever the iteration count."""

import pytest
import torch

from atom.bench.op_count import OpCounter
from atom.kernels.hc_sinkhorn import hc_sinkhorn, hc_sinkhorn_ref


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
    with pytest.raises(ValueError, match="power of two"):
        hc_sinkhorn(torch.zeros(2, 3, 3), 3, 1e-6)
