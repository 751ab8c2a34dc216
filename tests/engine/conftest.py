"""Fixtures for engine tests: one tiny checkpoint per session, the reference model, engine builders."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported, for the Triton-backend test

import pytest
import torch

from atom.builtin_model import ensure_builtin_model
from atom.models.deepseek_v4.checkpoint import load_checkpoint
from support.small_engines import small_engine_builder


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    return ensure_builtin_model(tmp_path_factory.mktemp("atom-cache"))


@pytest.fixture(scope="session")
def reference(tiny_dir):
    torch.set_num_threads(1)
    return load_checkpoint(tiny_dir)


@pytest.fixture(scope="session")
def reference_quant(tiny_dir):
    """The reference model with its FP8/FP4 activation round-trips on (``quant_sim``)."""
    torch.set_num_threads(1)
    return load_checkpoint(tiny_dir, quant_sim=True)


@pytest.fixture(scope="session")
def reference_quant64(tiny_dir):
    """The ``quant_sim`` reference model carrying its activations in float64."""
    torch.set_num_threads(1)
    return load_checkpoint(tiny_dir, dtype=torch.float64, quant_sim=True)


@pytest.fixture(scope="session")
def make_engine(tiny_dir, reference):
    """A builder of small engines over the tiny checkpoint; every call builds a new engine, so one builder
    serves the whole session (module fixtures that share an engine run use it too)."""
    return small_engine_builder(tiny_dir, reference.cfg.kv_spec)
