"""DeepSeek-V4 for serving: the engine's model over the paged KV arena (see docs/model.md).

It shares the reference model's parameter definitions and pure functions (:mod:`atom.models.deepseek_v4`)
and loads the same checkpoint; the reference stays the CPU oracle the engine is compared against.
"""

from .model import DeepseekV4ForServing

__all__ = ["DeepseekV4ForServing"]
