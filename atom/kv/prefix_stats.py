"""Where a request's prompt tokens came from: reused from the prefix cache, or lost, and why.

The block manager fills one :class:`PrefixStats` per request when it is admitted.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PrefixStats"]


@dataclass(slots=True)
class PrefixStats:
    """Where a request's prompt tokens came from (set when it is admitted, tokens)."""

    prompt_tokens: int = 0
    reused: int = 0
    lost_to_evicted_kv: int = 0
    lost_to_swa_window: int = 0
    lost_to_csa_state: int = 0
