"""Fixtures for engine tests: one tiny checkpoint per session, the reference model, engine builders."""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported, for the Triton-backend test

import pytest
import torch

from atom.builtin_model import ensure_builtin_model
from atom.config import CacheConfig, EngineConfig
from atom.model_engine.kv_layout import plan_kv_layout
from atom.model_engine.llm_engine import LLMEngine
from atom.model_executor.engine_builder import build_engine, kv_spec_of
from atom.models.deepseek_v4.checkpoint import load_checkpoint


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    return ensure_builtin_model(tmp_path_factory.mktemp("atom-cache"))


@pytest.fixture(scope="session")
def reference(tiny_dir):
    torch.set_num_threads(1)
    return load_checkpoint(tiny_dir)


def chunks_budget(model_cfg, num_chunks: int, max_seqs: int, max_model_len: int) -> int:
    """kv_cache_memory that gives exactly ``num_chunks`` arena chunks."""
    probe = plan_kv_layout(kv_spec_of(model_cfg), 1 << 30, max_seqs, max_model_len)
    return probe.state_pool_bytes + num_chunks * probe.chunk_bytes


@pytest.fixture
def make_engine(tiny_dir, reference):
    def make(*, budget=37, max_seqs=8, max_model_len=512, num_chunks=200, full_retain=False, interval=0,
             prefix_caching=True, poison=True, backend=None, batch_invariant=False) -> LLMEngine:
        kv = chunks_budget(reference.cfg, num_chunks, max_seqs, max_model_len)
        cfg = EngineConfig(model=str(tiny_dir), max_model_len=max_model_len, max_num_seqs=max_seqs,
                           max_num_batched_tokens=budget, kv_cache_memory=kv,
                           enable_prefix_caching=prefix_caching)
        cache = CacheConfig(kv_cache_bytes=kv, max_model_len=max_model_len, max_num_seqs=max_seqs,
                            enable_prefix_caching=prefix_caching, swa_full_retain=full_retain,
                            swa_retention_interval=interval)
        return build_engine(LLMEngine, cfg, cache=cache, keep_logits=True, poison=poison,
                            kernel_backend=backend, batch_invariant=batch_invariant)
    return make
