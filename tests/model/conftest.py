"""Shared fixtures for the DeepSeek-V4 reference model tests: tiny fp32 models with seeded random weights."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))  # for dsv4_testlib

from dsv4_testlib import build  # noqa: E402

from atom.models.deepseek_v4 import DeepseekV4Config, DeepseekV4Model  # noqa: E402


@pytest.fixture(scope="session")
def bi_model() -> DeepseekV4Model:
    """Batch-invariant tiny model: prefill, chunked extend and decode are bit-identical."""
    return build(DeepseekV4Config.tiny(batch_invariant=True))


@pytest.fixture(scope="session")
def model() -> DeepseekV4Model:
    """Tiny model in the default (batched linears) mode."""
    return build(DeepseekV4Config.tiny())
