"""KernelCounter counts Triton launches and launching aten ops; without running the launches it counts the
same and leaves the kernels' outputs as allocated."""

import torch

from atom.bench.kernel_count import KernelCounter
from atom.kernels.swiglu import swiglu, swiglu_ref


def _step(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    h = swiglu(gate, up, 10.0, torch.float32)  # one launch
    return (h + 1.0) * 2.0  # two aten ops


def test_skipping_the_launches_counts_what_running_them_counts():
    gate, up = torch.randn(3, 16), torch.randn(3, 16)
    with KernelCounter() as ran:
        out = _step(gate, up)
    with KernelCounter(run_triton=False) as skipped:
        _step(gate, up)
    assert (ran.triton, dict(ran.aten)) == (1, {"add": 1, "mul": 1})
    assert (skipped.triton, dict(skipped.aten)) == (ran.triton, dict(ran.aten))
    assert torch.allclose(out, (swiglu_ref(gate, up, 10.0, torch.float32) + 1.0) * 2.0, rtol=1e-5, atol=1e-6)


def test_a_skipped_launch_does_not_write_its_output():
    from atom.kernels.swiglu import _swiglu_kernel

    gate, up = torch.randn(1, 32), torch.randn(1, 32)
    out = torch.full((1, 32), 7.0)
    with KernelCounter(run_triton=False) as c:
        _swiglu_kernel[(1, 1)](gate, up, out, 32, 32, 32, 10.0, CLAMP=True, BLOCK=32)
    assert c.triton == 1 and torch.equal(out, torch.full((1, 32), 7.0))
