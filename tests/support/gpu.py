"""The marks of a GPU test module (``pytestmark = gpu_module_marks(...)``)."""

from __future__ import annotations

import pytest
import torch


def gpu_module_marks(covered_on_cpu_by: str, *, compiled_triton: bool = True) -> list[pytest.MarkDecorator]:
    """``gpu``; a skip without CUDA/ROCm whose reason names ``covered_on_cpu_by`` (the CPU tests of
    the same code); and, for modules that run Triton kernels (``compiled_triton``), the skip under
    the interpreter (the ``compiled_triton_only`` fixture of tests/gpu/conftest.py)."""
    marks = [pytest.mark.gpu,
             pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA or ROCm GPU "
                                f"(torch.cuda.is_available() is False); {covered_on_cpu_by}")]
    if compiled_triton:
        marks.insert(1, pytest.mark.usefixtures("compiled_triton_only"))
    return marks
