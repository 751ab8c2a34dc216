"""swiglu reads the two column halves of one merged ``w1`` / ``w3`` product in place: one launch, no copy of
either half, the same values as its reference on contiguous copies."""

import pytest
import torch

from atom.bench.kernel_count import KernelCounter
from atom.kernels.swiglu import swiglu, swiglu_ref


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows,width", [(1, 8), (5, 33), (3, 1031)])
def test_the_halves_of_a_merged_product_are_read_in_place_and_give_the_reference(rows, width, dtype, gen):
    merged = (torch.randn(rows, 2 * width, generator=gen) * 8).to(dtype)
    gate, up = merged.split(width, dim=-1)
    want = swiglu_ref(gate.contiguous(), up.contiguous(), 10.0, dtype)
    with KernelCounter() as count:
        got = swiglu(gate, up, 10.0, dtype)
    assert count.triton == 1 and sum(count.aten.values()) == 0  # no contiguous copy of a strided half
    assert got.is_contiguous() and got.shape == (rows, width)
    tol = dict(rtol=2 ** -7, atol=2 ** -7) if dtype == torch.bfloat16 else dict(rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(got, want, **tol)


def test_a_layout_without_unit_inner_stride_is_copied_first_and_gives_the_reference(gen):
    gate = torch.randn(6, 4, generator=gen).t()  # [4, 6] with inner stride 4
    up = torch.randn(4, 6, generator=gen)
    torch.testing.assert_close(swiglu(gate, up, 3.0, torch.float32), swiglu_ref(gate, up, 3.0, torch.float32),
                               rtol=1e-6, atol=1e-6)
