"""Fixtures shared by the GPU tests."""

from __future__ import annotations

import os

import pytest


@pytest.fixture
def compiled_triton_only():
    """Skips a Triton kernel test under the interpreter. Checked when each test runs, not at collection:
    tests/kernels/conftest.py may set the variable after collection."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("TRITON_INTERPRET=1 is set (tests/kernels is in this session): run `pytest tests/gpu` alone")
