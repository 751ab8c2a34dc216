"""DeepSeek-V4 reference model (CPU, pure torch) with an explicit per-sequence cache.

See docs/model.md.  Public API: ``DeepseekV4Config``, ``DeepseekV4Model``, ``SequenceCache``/``CacheSnapshot``,
``load_checkpoint``, ``save_checkpoint``, ``random_state_dict``, ``count_parameters``.

The torch-backed names load on first use, so ``atom.models.deepseek_v4.config`` (the config and the KV
spec it declares) stays importable by the torch-free control plane and capacity report.
"""

from __future__ import annotations

import importlib
from typing import Any

from .config import DeepseekV4Config

__all__ = ["CacheSnapshot", "DeepseekV4Config", "DeepseekV4Model", "ForwardOutput", "LayerCache",
           "SequenceCache"]

_LAZY = {"CacheSnapshot": "cache", "LayerCache": "cache", "SequenceCache": "cache", "DeepseekV4Model": "model",
         "ForwardOutput": "model"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
