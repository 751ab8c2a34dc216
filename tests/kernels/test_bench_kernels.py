"""The kernel benchmark on a machine without a GPU: it says what it needs and reports no figure."""

import pytest
import torch

from atom.kernels.bench_kernels import main


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present: the benchmark measures there (run it)")
@pytest.mark.parametrize("argv", [[], ["--gemm"]], ids=["kv-kernels", "gemm"])
def test_without_a_gpu_the_kernel_benchmark_says_it_needs_one_and_prints_no_figure(argv, capsys):
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == "bench_kernels needs a CUDA or ROCm GPU (torch.cuda.is_available() is False); nothing measured\n"
