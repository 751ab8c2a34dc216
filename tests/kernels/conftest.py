"""Kernel tests run Triton kernels in the interpreter on CPU.

TRITON_INTERPRET must be set before any ``@triton.jit`` function is defined, i.e. before
``atom.kernels`` is imported; conftest runs before the test modules import anything.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture
def gen() -> torch.Generator:
    """A seeded generator, so every random case is reproducible."""
    return torch.Generator().manual_seed(1234)
