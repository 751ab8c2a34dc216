"""Building a real engine from an EngineConfig: model, tokenizer, KV spec, layout, control plane, runner.

The model declares its KV needs (compress ratios, window, head dims) and the arena sizes itself from
them; nothing here knows about model families beyond loading a DeepSeek-V4 checkpoint.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

from atom import envs
from atom.config import CacheConfig, EngineConfig
from atom.kv.block_manager import BlockManager
from atom.spec_decode.draft_source import DraftSource, RunnerDrafts
from atom.kv.kv_layout import KvLayout, plan_kv_layout
from atom.model_engine.dp_engine import DataParallelEngine, check_data_parallel_config
from atom.model_engine.llm_engine import LLMEngine
from atom.model_engine.scheduler import Scheduler
from atom.model_executor.decode_graphs import serving_graph_mode
from atom.model_executor.model_runner import ModelRunner
from atom.model_executor.placement import (resolve_device, resolve_dtype, resolve_model_dir, resolve_quant_sim,
                                           resolve_row_format)
from atom.models.deepseek_v4.checkpoint import load_checkpoint
from atom.models.deepseek_v4.loader import read_config
from atom.models.deepseek_v4_serving import DeepseekV4ForServing

__all__ = ["build_engine", "resolve_row_format", "describe_kv"]

def describe_kv(layout: KvLayout) -> str:
    """One start-up line: the stored formats and the capacity they give."""
    spec = layout.spec
    return (f"KV cache {spec.row_format} rows ({spec.main_row_bytes} B) + {spec.index_format} indexer keys "
            f"({spec.index_row_bytes} B): {layout.num_chunks} chunks of {layout.chunk_bytes} B = "
            f"{layout.max_swa_pages * spec.block_size:,} SWA tokens or "
            f"{layout.max_compressed_pages * spec.block_size:,} compressed tokens "
            f"({layout.arena_bytes / 2**30:.3f} GiB arena)")


def build_engine(config: EngineConfig, *, keep_logits: bool = False, kernel_backend: str | None = None,
                 batch_invariant: bool = False, poison: bool | None = None, quant_sim: bool | None = None,
                 rank_group: Any = None, value_checks: bool = False, drafter: DraftSource | None = None,
                 step_thread: bool | None = None) -> LLMEngine | DataParallelEngine:
    """An :class:`LLMEngine` serving ``config.model.path`` (None: the built-in tiny model).

    The serving model (:class:`DeepseekV4ForServing`; the reference model is never built here) is loaded
    on ``config.model.device`` in ``config.model.dtype`` with its weights kept as stored (FP8 / MXFP4); its MTP block only with speculative decoding on
    (``config.scheduler.speculative_num_tokens`` > 0): the arena then counts the MTP layer and the runner
    drafts with it. ``drafter`` replaces the MTP drafts as the scheduler's draft source (tests: a
    replayed oracle or an always-wrong draft). ``poison`` fills the arena with NaN
    (default: the ``ATOM_DEBUG_NAN_ARENA`` flag); ``value_checks`` runs the kernels' value checks inside
    every step (tests; they sync the device). ``step_thread``: whether the runner runs launched steps
    on a thread of its own (``ModelRunner``; None = on a GPU only).
    ``quant_sim`` (when given) overrides ``config.model.quant_sim``: it runs
    the model's FP8/FP4 activation round-trips (with fp8 rows the engine then computes what the
    reference model with ``quant_sim`` computes). The arena's row format comes from
    ``config.cache.kv_cache_dtype`` (see :func:`resolve_row_format`).

    With ``config.parallel.tensor_parallel_size > 1`` the model is sharded over that many ranks
    (:mod:`atom.parallel`; each rank's weights kept as stored, rank ``k`` on GPU ``k % visible GPUs`` when
    the device is a GPU): this process is rank 0 and spawns the others, or joins the ranks ``torchrun``
    started when ``rank_group`` is given.

    With ``config.parallel.data_parallel_size`` D > 1 the ranks form D attention replicas of
    ``tensor_parallel_size`` ranks (:mod:`atom.parallel.dp_runner`), and the engine is a
    :class:`DataParallelEngine` over D schedulers, each with its own block manager over the same
    layout (``--kv-cache-memory`` is each replica's arena), behind the prefix-aware replica router.
    """
    from atom.builtin_model import ensure_builtin_model
    from atom.parallel.worker import RankSpec, layout_for, shard_plan_for
    from atom.tokenizer import Tokenizer

    env = envs.load()
    mc = config.model
    check_data_parallel_config(config)
    if config.cache.gpu_memory_utilization is not None and (
            config.parallel.world_size > 1 or resolve_device(mc.device).type == "cpu"):
        raise ValueError("--gpu-memory-utilization profiles one GPU's memory; on the CPU (or with tensor "
                         "parallelism) size the arena with --kv-cache-memory")
    path = mc.path
    model_dir = resolve_model_dir(path) if path else ensure_builtin_model()
    tokenizer = Tokenizer.from_dir(model_dir)
    poison = env.debug_nan_arena if poison is None else poison
    max_model_len = config.scheduler.max_model_len
    num_spec = config.scheduler.speculative_num_tokens
    size = config.parallel.world_size
    if size > 1 and config.cache.host_kv_cache_bytes:
        raise ValueError("--host-kv-cache-memory runs on one rank (tensor_parallel_size=1); the ranks' arenas "
                         "would each need their own host tier")
    if size > 1 and num_spec:
        raise ValueError(f"speculative_num_tokens={num_spec} needs "
                         "tensor_parallel_size=1 (the ranks would verify drafts separately)")
    if size > 1:
        from atom.parallel.executor import start_parallel_runner
        from atom.parallel.shard_loader import check_shardable

        device_type = resolve_device(mc.device).type  # rank k runs on GPU k % visible GPUs
        model_cfg = read_config(model_dir, batch_invariant=batch_invariant)
        layout = layout_for(model_cfg, config, on_gpu=device_type != "cpu")
        quant_sim = resolve_quant_sim(mc.quant_sim, model_dir) if quant_sim is None else quant_sim
        check_shardable(model_dir, shard_plan_for(config, 0, size, model_cfg), quant_sim=quant_sim)  # before any worker
        spec = RankSpec(config, str(model_dir), poison=poison, kernel_backend=kernel_backend,
                        batch_invariant=batch_invariant, device=device_type, eos_token_id=tokenizer.eos_token_id,
                        quant_sim=quant_sim)
        if config.parallel.data_parallel_size > 1:
            from atom.parallel.dp_runner import start_data_parallel_runner

            runner = start_data_parallel_runner(spec, keep_logits=keep_logits, group=rank_group)
        else:
            runner = start_parallel_runner(spec, keep_logits=keep_logits, group=rank_group)
        cache = config.cache
    else:
        device = resolve_device(mc.device)
        model = load_checkpoint(model_dir, dtype=resolve_dtype(mc.dtype, device), device=device, load_mtp=num_spec > 0,
                                progress=sys.stderr.isatty(), batch_invariant=batch_invariant,
                                quant_sim=resolve_quant_sim(mc.quant_sim, model_dir) if quant_sim is None else quant_sim,
                                model_class=DeepseekV4ForServing)  # the one model the engine builds
        model_cfg = model.cfg
        row_format = resolve_row_format(config.cache.kv_cache_dtype, on_gpu=model.device.type != "cpu",
                                        quantized="quantization_config" in model.cfg.extra)
        # the MTP layer's KV only when it drafts
        spec = model.cfg.kv_spec(row_format, include_mtp=num_spec > 0, block_size=config.cache.block_size)
        # with speculative decoding the replayed step is the verify step (every request padded to num_spec
        # drafts), which the memory profile runs at the largest bucket
        mode = serving_graph_mode(model, enforce_eager=mc.enforce_eager, keep_logits=keep_logits,
                                  value_checks=value_checks)
        cache = _profiled_cache(model, spec, config, graphs=mode == "graph", kernel_backend=kernel_backend)
        layout = plan_kv_layout(spec, cache, config.scheduler)
        runner = ModelRunner(model, layout, max_model_len=max_model_len, seed=mc.seed, poison=poison,
                             kernel_backend=kernel_backend, keep_logits=keep_logits,
                             eos_token_id=tokenizer.eos_token_id, value_checks=value_checks,
                             speculative_num_tokens=num_spec, graph_mode=mode, step_thread=step_thread,
                             host_kv_chunks=cache.host_kv_cache_bytes // layout.chunk_bytes)
    if tokenizer.vocab_size > model_cfg.vocab_size:
        raise ValueError(f"tokenizer has {tokenizer.vocab_size} tokens but the model only {model_cfg.vocab_size}")
    name = mc.served_model_name or (Path(path).name if path else "atom-tiny-dsv4")
    if config.parallel.data_parallel_size > 1:  # one scheduler and block manager per replica, same layout
        schedulers = [Scheduler(config.scheduler, BlockManager(layout, cache), eos_token_id=tokenizer.eos_token_id)
                      for _ in range(config.parallel.data_parallel_size)]
        return DataParallelEngine(schedulers, runner, tokenizer, model_name=name, max_model_len=max_model_len)
    bm = BlockManager(layout, cache, mtp_rows=num_spec > 0)  # the MTP layer writes rows only when it drafts
    scheduler = Scheduler(config.scheduler, bm, eos_token_id=tokenizer.eos_token_id,
                          drafter=drafter if drafter is not None else RunnerDrafts())
    return LLMEngine(scheduler, runner, tokenizer, model_name=name, max_model_len=max_model_len)


def _profiled_cache(model: DeepseekV4ForServing, spec: Any, config: EngineConfig, *, graphs: bool,
                    kernel_backend: str | None) -> CacheConfig:
    """``config.cache``, with ``kv_cache_bytes`` from the profiled GPU memory split when
    ``--gpu-memory-utilization`` is set (the split printed to stderr). The profiling runner drafts as the
    served one does; with ``graphs`` its decode step runs on the bucketed inputs (``padded``), the shapes
    the graphs capture (with speculative decoding: the verify step, every request padded to its drafts)."""
    if config.cache.gpu_memory_utilization is None:
        return config.cache
    from atom.model_executor.memory_profile import gpu_memory_split

    def runner(m: DeepseekV4ForServing, layout: KvLayout, *, max_model_len: int) -> ModelRunner:
        return ModelRunner(m, layout, max_model_len=max_model_len, kernel_backend=kernel_backend,
                           speculative_num_tokens=config.scheduler.speculative_num_tokens,
                           graph_mode="padded" if graphs else "eager")

    split = gpu_memory_split(model, spec, config.cache, config.scheduler, config.cache.gpu_memory_utilization,
                             graphs, runner)
    print(split.describe(), file=sys.stderr)
    return dataclasses.replace(config.cache, kv_cache_bytes=split.kv_bytes)
