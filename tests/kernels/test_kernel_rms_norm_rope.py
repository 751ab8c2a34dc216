"""rms_norm_rope: RMSNorm then RoPE in one launch. The torch reference is the attention's per-head query arithmetic
bit for bit; the Triton kernel (interpreter) gives the bits of the rms_norm kernel followed by the rope kernel, reads
strided views (a column slice of a merged GEMM's output) in place, and is one launch; rms_norm reads strided rows
in place too."""

import pytest
import torch

from atom.bench.kernel_count import KernelCounter
from atom.kernels.rms_norm import rms_norm, rms_norm_ref
from atom.kernels.rope import rms_norm_rope, rms_norm_rope_ref, rope, rope_ref
from atom.models.deepseek_v4.layers import rms_normalize
from atom.models.deepseek_v4.rope import apply_rope, rope_frequencies

DTYPES = [torch.float32, torch.bfloat16]


def strided(x: torch.Tensor, gen: torch.Generator, extra: int = 5) -> torch.Tensor:
    """``x`` as the leading columns of a wider tensor: the same values behind a row stride larger than the row."""
    t, rest = x.shape[0], x[0].numel()
    wide = torch.randn(t, rest + extra, generator=gen).to(x.dtype)
    wide[:, :rest] = x.reshape(t, rest)
    return wide[:, :rest].unflatten(1, x.shape[1:])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("weighted", [False, True], ids=["no-weight", "weight"])
@pytest.mark.parametrize("shape,rope_dim", [((1, 8), 8), ((4, 3, 40), 8), ((3, 16, 33), 16), ((7, 2, 64), 16)])
def test_the_kernel_gives_the_bits_of_rms_norm_then_rope_and_equals_its_reference(shape, rope_dim, weighted, dtype,
                                                                                  gen):
    x = (torch.randn(*shape, generator=gen) * 3).to(dtype)
    weight = torch.randn(shape[-1], generator=gen).to(dtype) if weighted else None
    positions = torch.randint(0, 70000, (shape[0],), generator=gen)
    freqs = rope_frequencies(rope_dim, 160000.0, 65536, 16.0)
    chained = rope(rms_norm(x, weight, 1e-6), positions, freqs)
    for given in (x, strided(x, gen)):
        got = rms_norm_rope(given, weight, 1e-6, positions.to(torch.int32), freqs)
        assert got.is_contiguous() and got.shape == x.shape and got.dtype == dtype
        assert torch.equal(got, chained)
    want = rms_norm_rope_ref(x, weight, 1e-6, positions, freqs)
    assert torch.equal(want, rope_ref(rms_norm_ref(x, weight, 1e-6), positions, freqs))
    tol = dict(rtol=2e-6, atol=2e-6) if dtype == torch.float32 else dict(rtol=8e-3, atol=1e-5)
    torch.testing.assert_close(chained, want, **tol)


def test_the_reference_is_the_attention_query_norm_and_rotation_bit_for_bit(gen):
    q = torch.randn(5, 4, 24, generator=gen).to(torch.bfloat16)
    positions = torch.randint(0, 5000, (5,), generator=gen)
    freqs = rope_frequencies(8, 10000.0)
    model = apply_rope(rms_normalize(q.float(), 1e-6).to(q.dtype), positions, freqs)
    assert torch.equal(rms_norm_rope_ref(q, None, 1e-6, positions, freqs), model)


def test_a_strided_view_is_read_in_place_in_one_launch(gen):
    x = strided(torch.randn(6, 4, 16, generator=gen), gen)
    rows = strided(torch.randn(6, 16, generator=gen), gen)  # rms_norm: rows of one stride
    positions, freqs, weight = torch.arange(6), torch.ones(4), torch.ones(16)
    assert not x.is_contiguous() and not rows.is_contiguous()
    for call in (lambda: rms_norm_rope(x, None, 1e-6, positions, freqs), lambda: rope(x, positions, freqs),
                 lambda: rms_norm(rows, weight, 1e-6)):
        with KernelCounter() as count:
            call()
        assert (count.triton, dict(count.aten)) == (1, {})


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(1, 7), (5, 33), (3, 4, 129)])
def test_rms_norm_of_strided_rows_equals_it_on_a_contiguous_copy(shape, dtype, gen):
    x = (torch.randn(*shape, generator=gen) * 3).to(dtype)
    weight = torch.randn(shape[-1], generator=gen)
    assert torch.equal(rms_norm(strided(x, gen), weight, 1e-6), rms_norm(x, weight, 1e-6))


def test_bad_arguments_are_refused_with_what_is_accepted():
    with pytest.raises(ValueError, match="weight must be None or a \\[8\\]"):
        rms_norm_rope(torch.zeros(2, 8), torch.zeros(7), 1e-6, torch.arange(2), torch.ones(2))
    with pytest.raises(ValueError, match="eps must be a float >= 0"):
        rms_norm_rope(torch.zeros(2, 8), None, -1.0, torch.arange(2), torch.ones(2))
    with pytest.raises(ValueError, match="2 \\* len\\(freqs\\) = 10 must be in 1..8"):
        rms_norm_rope_ref(torch.zeros(2, 8), None, 1e-6, torch.arange(2), torch.ones(5))
