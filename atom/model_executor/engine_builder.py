"""Building a real engine from an EngineConfig: model, tokenizer, KV spec, layout, control plane, runner.

The model declares its KV needs (compress ratios, window, head dims) and the arena sizes itself from
them; nothing here knows about model families beyond loading a DeepSeek-V4 checkpoint.
"""

from __future__ import annotations

import sys
from pathlib import Path

from atom import envs
from atom.config import EngineConfig
from atom.model_engine.block_manager import BlockManager
from atom.model_engine.kv_layout import plan_kv_layout
from atom.model_engine.llm_engine import LLMEngine
from atom.model_engine.scheduler import Scheduler
from atom.model_executor.model_runner import ModelRunner
from atom.model_executor.placement import resolve_device, resolve_dtype, resolve_model_dir, resolve_quant_sim
from atom.models.deepseek_v4.checkpoint import load_checkpoint

__all__ = ["build_engine"]


def build_engine(config: EngineConfig, *, keep_logits: bool = False, kernel_backend: str | None = None,
                 batch_invariant: bool = False, poison: bool | None = None) -> LLMEngine:
    """An :class:`LLMEngine` serving ``config.model.path`` (None: the built-in tiny model).

    The model is loaded on ``config.model.device`` in ``config.model.dtype`` with its weights kept as
    stored (FP8 / MXFP4), without the MTP block (not served). ``poison`` fills the arena with NaN
    (default: the ``ATOM_DEBUG_NAN_ARENA`` flag).
    """
    from atom.builtin_model import ensure_builtin_model
    from atom.tokenizer import Tokenizer

    if config.parallel.tensor_parallel_size != 1:
        raise ValueError(f"tensor_parallel_size={config.parallel.tensor_parallel_size}: this engine runs the "
                         "model on one device; accepted: 1")
    env = envs.load()
    mc = config.model
    path = mc.path
    model_dir = resolve_model_dir(path) if path else ensure_builtin_model()
    device = resolve_device(mc.device)
    model = load_checkpoint(model_dir, dtype=resolve_dtype(mc.dtype, device), device=device, load_mtp=False,
                            progress=sys.stderr.isatty(), batch_invariant=batch_invariant,
                            quant_sim=resolve_quant_sim(mc.quant_sim, model_dir))
    tokenizer = Tokenizer.from_dir(model_dir)
    if tokenizer.vocab_size > model.cfg.vocab_size:
        raise ValueError(f"tokenizer has {tokenizer.vocab_size} tokens but the model only {model.cfg.vocab_size}")
    # the main layers only (MTP is not served), fp32 rows on the CPU path
    spec = model.cfg.kv_spec("fp32", include_mtp=False, block_size=config.cache.block_size)
    layout = plan_kv_layout(spec, config.cache, config.scheduler)
    bm = BlockManager(layout, config.cache)
    scheduler = Scheduler(config.scheduler, bm, eos_token_id=tokenizer.eos_token_id)
    max_model_len = config.scheduler.max_model_len
    runner = ModelRunner(model, layout, max_model_len=max_model_len, seed=config.model.seed,
                         poison=env.debug_nan_arena if poison is None else poison,
                         kernel_backend=kernel_backend, keep_logits=keep_logits,
                         eos_token_id=tokenizer.eos_token_id)
    name = config.model.served_model_name or (Path(path).name if path else "atom-tiny-dsv4")
    return LLMEngine(scheduler, runner, tokenizer, model_name=name, max_model_len=max_model_len)
