"""The tiny model's configuration with only its first three layers (random weights drawn as the tiny model's
are), for the slow engine tests on the Triton interpreter.

Under ``TRITON_INTERPRET=1`` an engine step costs about the same per layer (each layer runs its attention, its
two mHC mixes and its MoE as interpreted programs), so these tests spend their time in layers that repeat
the first three: the tiny model's layers are a sliding-window layer, a CSA layer (compress ratio 4, with an
indexer) and an HCA layer (ratio 16), the first two with hash routing and the third with score routing, then
CSA, HCA and CSA layers again with score routing. The three-layer model keeps one layer of each attention kind
and both kinds of routing, the MTP layer and every dimension, so each kernel and code path those tests compare
still runs, on half the layers.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from atom.model_engine.llm_engine import LLMEngine
from atom.models.deepseek_v4.checkpoint import random_tensors, save_checkpoint
from atom.models.deepseek_v4.config import DeepseekV4Config
from atom.models.deepseek_v4.loader import read_config
from atom.tokenizer import write_builtin_tokenizer
from support.small_engines import small_engine_builder

#: sliding window, CSA, HCA, then the MTP layer's ratio (the tiny model's first three layers and its MTP layer)
SHALLOW = dict(n_layers=3, compress_ratios=(0, 4, 16, 0))


def shallow_config(**overrides: Any) -> DeepseekV4Config:
    """``DeepseekV4Config.tiny`` with :data:`SHALLOW` and ``overrides``."""
    return DeepseekV4Config.tiny(**{**SHALLOW, **overrides})


def write_shallow_checkpoint(out_dir: str | Path, *, seed: int = 0, fp8: bool = False, fp4_experts: bool = False,
                             shards: int = 1, **overrides: Any) -> Path:
    """A checkpoint of :func:`shallow_config` with ``random_tensors(cfg, seed)`` and the built-in tokenizer, stored
    as ``make_tiny_checkpoint`` stores the tiny model (``fp8`` linears, MXFP4 experts, shards)."""
    cfg = shallow_config(**overrides)
    path = save_checkpoint(out_dir, cfg, random_tensors(cfg, seed), fp8=fp8, fp4_experts=fp4_experts, shards=shards)
    write_builtin_tokenizer(path)
    return path


@pytest.fixture(scope="module")
def shallow_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A :func:`write_shallow_checkpoint` (fp32, seed 0, as the built-in tiny model) written once per module."""
    return write_shallow_checkpoint(tmp_path_factory.mktemp("shallow"))


@pytest.fixture(scope="module")
def make_shallow_engine(shallow_dir: Path) -> Callable[..., LLMEngine]:
    """Engines over :func:`shallow_dir`, built as the engine tests' ``make_engine`` builds them over the tiny
    model (:func:`~support.small_engines.small_engine_builder`)."""
    return small_engine_builder(shallow_dir, read_config(shallow_dir).kv_spec)


@pytest.fixture(scope="module")
def shallow_release_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """:func:`write_shallow_checkpoint` in the release format (FP8 linears, MXFP4 experts, two shards), as
    ``make_tiny_checkpoint(fp8=True, fp4_experts=True, shards=2)`` writes the tiny model; once per module."""
    return write_shallow_checkpoint(tmp_path_factory.mktemp("shallow-release"), fp8=True, fp4_experts=True, shards=2)
