"""DeepSeek-V4 reference model (CPU, pure torch) with an explicit per-sequence cache.

See docs/model.md.  Public API: ``DeepseekV4Config``, ``DeepseekV4Model``, ``SequenceCache``/``CacheSnapshot``,
``load_checkpoint``, ``save_checkpoint``, ``random_state_dict``, ``count_parameters``.
"""

from .cache import CacheSnapshot, LayerCache, SequenceCache
from .config import DeepseekV4Config
from .model import DeepseekV4Model, ForwardOutput

__all__ = ["CacheSnapshot", "DeepseekV4Config", "DeepseekV4Model", "ForwardOutput", "LayerCache",
           "SequenceCache"]
