"""Small engines over a checkpoint directory, for the engine tests: one builder, every call a new engine."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from atom.config import CacheConfig, Dsv4KvSpec, EngineConfig, ModelConfig, SchedulerConfig
from atom.engine_builder import build_engine
from atom.kv.kv_layout import KvLayout
from atom.model_engine.llm_engine import LLMEngine
from atom.model_executor.placement import resolve_row_format


def small_engine_builder(model_dir: Path, spec_of: Callable[..., Dsv4KvSpec]) -> Callable[..., LLMEngine]:
    """A builder of engines over ``model_dir`` whose arena holds ``num_chunks`` chunks of the layout
    ``spec_of(row_format, include_mtp=...)`` gives (the checkpoint's ``kv_spec``); logits kept, value
    checks on."""
    def make(*, budget=37, max_seqs=8, max_model_len=512, num_chunks=200, full_retain=False, interval=0,
             prefix_caching=True, poison=True, backend=None, batch_invariant=False, kv_cache_dtype="fp32",
             quant_sim=False, speculative=0, drafter=None, chunk_pages=0, dtype="auto", overlap=True) -> LLMEngine:
        limits = SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=max_seqs, max_model_len=max_model_len,
                                 speculative_num_tokens=speculative, overlap=overlap)
        rows = resolve_row_format(kv_cache_dtype, on_gpu=False, quantized=False)
        spec = spec_of(rows, include_mtp=speculative > 0)
        kv = KvLayout.for_chunks(spec, num_chunks, limits, CacheConfig(chunk_pages=chunk_pages)).kv_cache_bytes
        cache = CacheConfig(kv_cache_bytes=kv, enable_prefix_caching=prefix_caching, swa_full_retain=full_retain,
                            swa_retention_interval=interval, kv_cache_dtype=kv_cache_dtype, chunk_pages=chunk_pages)
        cfg = EngineConfig(ModelConfig(path=str(model_dir), dtype=dtype), limits, cache)
        return build_engine(cfg, keep_logits=True, poison=poison, kernel_backend=backend,
                            batch_invariant=batch_invariant, quant_sim=quant_sim, value_checks=True,
                            drafter=drafter)
    return make
