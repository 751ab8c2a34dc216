"""Fixtures for engine tests: one tiny checkpoint per session, the reference model, engine builders."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported, for the Triton-backend test

import pytest
import torch

from atom.builtin_model import ensure_builtin_model
from atom.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from atom.kv.kv_layout import KvLayout
from atom.model_engine.llm_engine import LLMEngine
from atom.engine_builder import build_engine
from atom.models.deepseek_v4.checkpoint import load_checkpoint


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


ROW_FORMAT = {"fp32": "fp32", "bf16": "bf16", "fp8": "fp8_ds_mla"}


@pytest.fixture(scope="session")
def make_engine(tiny_dir, reference):
    """A builder of small engines over the tiny checkpoint; every call builds a new engine, so one builder
    serves the whole session (module fixtures that share an engine run use it too)."""
    def make(*, budget=37, max_seqs=8, max_model_len=512, num_chunks=200, full_retain=False, interval=0,
             prefix_caching=True, poison=True, backend=None, batch_invariant=False, kv_cache_dtype="fp32",
             quant_sim=False, speculative=0, drafter=None, chunk_pages=0, dtype="auto", overlap=True) -> LLMEngine:
        limits = SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=max_seqs, max_model_len=max_model_len,
                                 speculative_num_tokens=speculative, overlap=overlap)
        spec = reference.cfg.kv_spec(ROW_FORMAT[kv_cache_dtype], include_mtp=speculative > 0)
        kv = KvLayout.for_chunks(spec, num_chunks, limits, CacheConfig(chunk_pages=chunk_pages)).kv_cache_bytes
        cache = CacheConfig(kv_cache_bytes=kv, enable_prefix_caching=prefix_caching, swa_full_retain=full_retain,
                            swa_retention_interval=interval, kv_cache_dtype=kv_cache_dtype, chunk_pages=chunk_pages)
        cfg = EngineConfig(ModelConfig(path=str(tiny_dir), dtype=dtype), limits, cache)
        return build_engine(cfg, keep_logits=True, poison=poison, kernel_backend=backend,
                            batch_invariant=batch_invariant, quant_sim=quant_sim, value_checks=True,
                            drafter=drafter)
    return make
