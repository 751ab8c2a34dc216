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

from atom.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from atom.engine_builder import build_engine
from atom.kv.kv_layout import KvLayout
from atom.model_engine.llm_engine import LLMEngine
from atom.models.deepseek_v4.checkpoint import random_tensors, save_checkpoint
from atom.models.deepseek_v4.config import DeepseekV4Config
from atom.models.deepseek_v4.loader import read_config
from atom.tokenizer import write_builtin_tokenizer

#: sliding window, CSA, HCA, then the MTP layer's ratio (the tiny model's first three layers and its MTP layer)
SHALLOW = dict(n_layers=3, compress_ratios=(0, 4, 16, 0))

ROW_FORMAT = {"fp32": "fp32", "bf16": "bf16", "fp8": "fp8_ds_mla"}


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


def engine_builder(model_dir: Path) -> Callable[..., LLMEngine]:
    """Engines over ``model_dir`` built as the engine tests' ``make_engine`` builds them over the tiny model
    (the same defaults and knobs), every call a new engine."""
    spec_of = read_config(model_dir).kv_spec

    def make(*, budget: int = 37, max_seqs: int = 8, max_model_len: int = 512, num_chunks: int = 200,
             backend: str | None = None, kv_cache_dtype: str = "fp32", quant_sim: bool = False,
             poison: bool = True) -> LLMEngine:
        limits = SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=max_seqs, max_model_len=max_model_len)
        kv = KvLayout.for_chunks(spec_of(ROW_FORMAT[kv_cache_dtype], include_mtp=False), num_chunks, limits,
                                 CacheConfig()).kv_cache_bytes
        cache = CacheConfig(kv_cache_bytes=kv, kv_cache_dtype=kv_cache_dtype)
        cfg = EngineConfig(ModelConfig(path=str(model_dir)), limits, cache)
        return build_engine(cfg, keep_logits=True, poison=poison, kernel_backend=backend, quant_sim=quant_sim,
                            value_checks=True)
    return make


@pytest.fixture(scope="module")
def shallow_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A :func:`write_shallow_checkpoint` (fp32, seed 0, as the built-in tiny model) written once per module."""
    return write_shallow_checkpoint(tmp_path_factory.mktemp("shallow"))


@pytest.fixture(scope="module")
def make_shallow_engine(shallow_dir: Path) -> Callable[..., LLMEngine]:
    """:func:`engine_builder` over :func:`shallow_dir`."""
    return engine_builder(shallow_dir)


@pytest.fixture(scope="module")
def shallow_release_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """:func:`write_shallow_checkpoint` in the release format (FP8 linears, MXFP4 experts, two shards), as
    ``make_tiny_checkpoint(fp8=True, fp4_experts=True, shards=2)`` writes the tiny model; once per module."""
    return write_shallow_checkpoint(tmp_path_factory.mktemp("shallow-release"), fp8=True, fp4_experts=True, shards=2)
