"""Shared fixtures for the DeepSeek-V4 reference model tests: tiny fp32 models with seeded random weights."""

from __future__ import annotations

import pytest
import torch
from support.dsv4 import build

from atom.models.deepseek_v4 import DeepseekV4Config, DeepseekV4Model


@pytest.fixture(scope="session")
def bi_model() -> DeepseekV4Model:
    """Batch-invariant tiny model: prefill, chunked extend and decode are bit-identical."""
    return build(DeepseekV4Config.tiny(batch_invariant=True))


@pytest.fixture(scope="session")
def model() -> DeepseekV4Model:
    """Tiny model in the default (batched linears) mode."""
    return build(DeepseekV4Config.tiny())


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    """The tiny model is launch-bound: one intra-op thread is faster and immune to OpenMP spin-waits when other
    processes share the 2 cores.  Restored after each module so other test directories are unaffected."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
