"""Fixtures for engine tests: one tiny checkpoint per session, the reference model, engine builders."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported, for the Triton-backend test

import pytest
import torch

from atom.builtin_model import ensure_builtin_model
from atom.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from atom.model_engine.kv_layout import KvLayout
from atom.model_engine.llm_engine import LLMEngine
from atom.model_executor.engine_builder import build_engine
from atom.models.deepseek_v4.checkpoint import load_checkpoint


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    return ensure_builtin_model(tmp_path_factory.mktemp("atom-cache"))


@pytest.fixture(scope="session")
def reference(tiny_dir):
    torch.set_num_threads(1)
    return load_checkpoint(tiny_dir)


@pytest.fixture
def make_engine(tiny_dir, reference):
    def make(*, budget=37, max_seqs=8, max_model_len=512, num_chunks=200, full_retain=False, interval=0,
             prefix_caching=True, poison=True, backend=None, batch_invariant=False) -> LLMEngine:
        limits = SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=max_seqs, max_model_len=max_model_len)
        kv = KvLayout.for_chunks(reference.cfg.kv_spec("fp32", include_mtp=False), num_chunks, limits).kv_cache_bytes
        cache = CacheConfig(kv_cache_bytes=kv, enable_prefix_caching=prefix_caching, swa_full_retain=full_retain,
                            swa_retention_interval=interval)
        cfg = EngineConfig(ModelConfig(path=str(tiny_dir)), limits, cache)
        return build_engine(cfg, keep_logits=True, poison=poison, kernel_backend=backend,
                            batch_invariant=batch_invariant)
    return make
