"""Building a real engine from an EngineConfig: model, tokenizer, KV spec, layout, control plane, runner.

The model declares its KV needs (compress ratios, window, head dims) and the arena sizes itself from
them; nothing here knows about model families beyond loading a DeepSeek-V4 checkpoint.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from atom import envs
from atom.config import CacheConfig, Dsv4KvSpec, EngineConfig
from atom.model_engine.block_manager import BlockManager
from atom.model_engine.kv_layout import plan_kv_layout
from atom.model_engine.scheduler import Scheduler
from atom.model_executor.model_runner import ModelRunner
from atom.models.deepseek_v4.checkpoint import load_checkpoint
from atom.models.deepseek_v4.config import DeepseekV4Config

__all__ = ["build_engine", "kv_spec_of"]


def kv_spec_of(cfg: DeepseekV4Config, block_size: int = 0) -> Dsv4KvSpec:
    """The KV spec of the layers the engine runs (main layers; MTP is not served), fp32 rows."""
    return Dsv4KvSpec(compress_ratios=tuple(cfg.compress_ratios[: cfg.n_layers]), sliding_window=cfg.window_size,
                      head_dim=cfg.head_dim, rope_head_dim=cfg.rope_head_dim, index_head_dim=cfg.index_head_dim,
                      row_format="fp32", block_size=block_size)


def build_engine(engine_cls: type, config: EngineConfig, *, cache: CacheConfig | None = None,
                 keep_logits: bool = False, kernel_backend: str | None = None, batch_invariant: bool = False,
                 poison: bool | None = None) -> Any:
    """An ``engine_cls`` (LLMEngine) serving ``config.model`` (None: the built-in tiny model).

    ``cache`` overrides the cache settings otherwise derived from ``config`` and the environment
    (tests use it to set the retention flags); ``poison`` fills the arena with NaN (default: the
    ``ATOM_DEBUG_NAN_ARENA`` flag).
    """
    from atom.builtin_model import ensure_builtin_model
    from atom.tokenizer import Tokenizer

    env = envs.load()
    model_dir = Path(config.model) if config.model else ensure_builtin_model()
    if not model_dir.is_dir():
        raise ValueError(f"model directory {model_dir} does not exist")
    model = load_checkpoint(model_dir, batch_invariant=batch_invariant)
    tokenizer = Tokenizer.from_dir(model_dir)
    if tokenizer.vocab_size > model.cfg.vocab_size:
        raise ValueError(f"tokenizer has {tokenizer.vocab_size} tokens but the model only {model.cfg.vocab_size}")
    spec = kv_spec_of(model.cfg, config.block_size)
    layout = plan_kv_layout(spec, config.kv_cache_memory, config.max_num_seqs, config.max_model_len)
    bm = BlockManager(layout, cache if cache is not None else config.cache(env))
    scheduler = Scheduler(config.scheduler, bm, eos_token_id=tokenizer.eos_token_id)
    runner = ModelRunner(model, layout, max_model_len=config.max_model_len, seed=config.seed,
                         poison=env.debug_nan_arena if poison is None else poison,
                         kernel_backend=kernel_backend, keep_logits=keep_logits)
    name = config.served_model_name or (model_dir.name if config.model else "atom-tiny-dsv4")
    return engine_cls(scheduler, runner, tokenizer, model_name=name, max_model_len=config.max_model_len)
