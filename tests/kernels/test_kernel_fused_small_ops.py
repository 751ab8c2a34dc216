"""The fused small ops (rms_norm, swiglu, rope, hc_post, hc_pre): each torch reference equals the reference model's own
arithmetic bit for bit, and each Triton kernel (interpreter) equals its reference at random shapes (one token,
odd widths, bf16 and fp32), within the last bits that a different reduction order or libm gives."""

import pytest
import torch

from atom.kernels.hc_post import hc_post, hc_post_ref
from atom.kernels.hc_pre import hc_pre, hc_pre_ref
from atom.kernels.rms_norm import rms_norm, rms_norm_ref
from atom.kernels.rope import rope, rope_ref
from atom.kernels.swiglu import swiglu, swiglu_ref
from atom.models.deepseek_v4.layers import RMSNorm, rms_normalize
from atom.models.deepseek_v4.mhc import hc_pre as model_hc_pre
from atom.models.deepseek_v4.rope import apply_rope, rope_frequencies
from atom.models.deepseek_v4_serving.block import hc_post_accumulate

DTYPES = [torch.float32, torch.bfloat16]


def tol(dtype):
    """Kernel vs reference: fp32 within a few ulps; bf16 within one bf16 ulp (a last-bit fp32 difference can
    round the other way)."""
    return dict(rtol=2e-6, atol=2e-6) if dtype == torch.float32 else dict(rtol=8e-3, atol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 7), (5, 33), (3, 4, 129), (2, 512)])
def test_rms_norm_kernel_equals_its_reference(shape, dtype, gen):
    x = (torch.randn(*shape, generator=gen) * 3).to(dtype)
    w = torch.randn(shape[-1], generator=gen).to(dtype)
    for weight in (w, None):
        got = rms_norm(x, weight, 1e-6)
        assert got.dtype == dtype and got.shape == x.shape
        torch.testing.assert_close(got, rms_norm_ref(x, weight, 1e-6), **tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_reference_is_the_model_norm_bit_for_bit(dtype, gen):
    x = torch.randn(6, 4, 40, generator=gen).to(dtype)
    norm = RMSNorm(40, 1e-6, dtype=dtype)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(40, generator=gen))
        assert torch.equal(rms_norm_ref(x, norm.weight, 1e-6), norm(x))
    assert torch.equal(rms_norm_ref(x, None, 1e-6), rms_normalize(x.float(), 1e-6).to(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 1), (3, 17), (2, 5, 1031)])
def test_swiglu_kernel_equals_its_reference(shape, dtype, gen):
    gate = (torch.randn(*shape, generator=gen) * 8).to(dtype)
    up = (torch.randn(*shape, generator=gen) * 8).to(dtype)
    for limit in (10.0, 0.0):
        got = swiglu(gate, up, limit, dtype)
        assert got.dtype == dtype
        torch.testing.assert_close(got, swiglu_ref(gate, up, limit, dtype), **tol(dtype))


def test_swiglu_clamps_up_both_ways_and_gate_from_above():
    gate = torch.tensor([[20.0, -20.0, 1.0]])
    up = torch.tensor([[30.0, -30.0, 2.0]])
    want = torch.tensor([[10.0 * torch.sigmoid(torch.tensor(10.0)) * 10.0,
                          -20.0 * torch.sigmoid(torch.tensor(-20.0)) * -10.0, torch.sigmoid(torch.tensor(1.0)) * 2.0]])
    torch.testing.assert_close(swiglu_ref(gate, up, 10.0, torch.float32), want, rtol=0, atol=1e-6)
    torch.testing.assert_close(swiglu(gate, up, 10.0, torch.float32), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,rope_dim", [((1, 8), 8), ((4, 3, 40), 8), ((3, 64, 33), 16), ((2, 20), 4)])
def test_rope_kernel_equals_its_reference(shape, rope_dim, dtype, gen):
    x = torch.randn(*shape, generator=gen).to(dtype)
    positions = torch.randint(0, 70000, (shape[0],), generator=gen)
    freqs = rope_frequencies(rope_dim, 160000.0, 65536, 16.0)
    for inverse in (False, True):
        got = rope(x, positions.to(torch.int32), freqs, inverse)
        want = rope_ref(x, positions, freqs, inverse)
        assert torch.equal(got[..., :-rope_dim], x[..., :-rope_dim])
        # angles up to 7e4 rad: an ulp of the angle moves cos/sin by ~4e-12, libm differences stay in the last bits
        torch.testing.assert_close(got, want, **tol(dtype))


@pytest.mark.parametrize("inverse", [False, True])
def test_rope_reference_is_the_model_rotation_bit_for_bit(inverse, gen):
    x = torch.randn(5, 4, 24, generator=gen)
    positions = torch.randint(0, 5000, (5,), generator=gen)
    freqs = rope_frequencies(8, 10000.0)
    assert torch.equal(rope_ref(x, positions, freqs, inverse), apply_rope(x, positions, freqs, inverse))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens,width", [(1, 7), (3, 33), (2, 1500)])
def test_hc_post_kernel_equals_its_reference_and_the_serving_fold(tokens, width, dtype, gen):
    y = torch.randn(tokens, width, generator=gen).to(dtype)
    residual = torch.randn(tokens, 4, width, generator=gen).to(dtype)
    post = torch.rand(tokens, 4, generator=gen) * 2
    comb = torch.rand(tokens, 4, 4, generator=gen)
    want = hc_post_ref(y, residual, post, comb)
    assert torch.equal(want, hc_post_accumulate(y, residual, post, comb))
    assert torch.equal(hc_post(y, residual, post, comb), want)  # the same fp32 operations in the same order


def test_bad_arguments_are_refused_with_what_is_accepted():
    with pytest.raises(ValueError, match="weight must be None or a \\[8\\]"):
        rms_norm(torch.zeros(2, 8), torch.zeros(7), 1e-6)
    with pytest.raises(ValueError, match="must have the same shape"):
        swiglu(torch.zeros(2, 8), torch.zeros(2, 9), 1.0, torch.float32)
    with pytest.raises(ValueError, match="positions must be an int32/int64"):
        rope(torch.zeros(2, 8), torch.zeros(2), torch.ones(2))
    with pytest.raises(ValueError, match="hc_post needs hc a power of two"):
        hc_post(torch.zeros(1, 4), torch.zeros(1, 3, 4), torch.zeros(1, 3), torch.zeros(1, 3, 3))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tokens,width", [(1, 7), (3, 40), (2, 300)])
def test_hc_pre_kernel_equals_its_reference_and_the_model(tokens, width, dtype, gen):
    h = torch.randn(tokens, 4, width, generator=gen).to(dtype)
    fn = torch.randn(24, 4 * width, generator=gen) * 0.1
    scale, base = torch.rand(3, generator=gen) + 0.5, torch.randn(24, generator=gen) * 0.1
    want = hc_pre_ref(h, fn, scale, base, 20, 1e-6, 1e-6)
    for got_part, model_part in zip(want, model_hc_pre(h, fn, scale, base, 20, 1e-6, 1e-6)):
        assert torch.equal(got_part, model_part)
    for got_part, want_part in zip(hc_pre(h, fn, scale, base, 20, 1e-6, 1e-6), want):
        torch.testing.assert_close(got_part, want_part, **tol(got_part.dtype))


def test_each_small_op_is_one_launch_and_nothing_else(gen):
    from atom.bench.kernel_count import KernelCounter

    h = torch.randn(3, 4, 16, generator=gen)
    ones = {shape: torch.ones(shape) for shape in [(16,), (4,), (3, 4), (3, 4, 4), (24, 64), (3,), (24,)]}
    pos, y = torch.arange(3), h[:, 0].contiguous()
    calls = [lambda: rms_norm(h, ones[(16,)], 1e-6), lambda: swiglu(h, h, 10.0, torch.float32),
             lambda: rope(h, pos, ones[(4,)], False),
             lambda: hc_post(y, h, ones[(3, 4)], ones[(3, 4, 4)]),
             lambda: hc_pre(h, ones[(24, 64)], ones[(3,)], ones[(24,)], 20, 1e-6, 1e-6)]
    for call in calls:
        with KernelCounter() as count:
            call()
        assert (count.triton, dict(count.aten)) == (1, {})
