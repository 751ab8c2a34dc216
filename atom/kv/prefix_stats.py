"""Where prompt tokens came from: reused from the prefix cache, or lost, and why.

One class for one request and for totals: the block manager fills a request's :class:`PrefixStats`
when it is first admitted and adds it to its running totals (``BlockManager.counters``); the engine's
statistics (``EngineStats.prefix``) and ``/metrics`` report those totals under the same field names.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PrefixStats"]


@dataclass(slots=True)
class PrefixStats:
    """Prompt tokens, in tokens: ``prompt_tokens`` looked up in the prefix cache, ``reused`` served
    from it, and of the rest, those whose KV was cached once but could not serve, by reason."""

    prompt_tokens: int = 0
    reused: int = 0
    lost_to_evicted_kv: int = 0  # the compressed KV was cached, then evicted
    lost_to_swa_window: int = 0  # compressed KV cached, but no cached sliding window ends there
    lost_to_csa_state: int = 0  # a window is cached, but not the CSA compressor state at its boundary
    reused_from_host: int = 0  # of ``reused``, tokens the device cache alone could not serve (host tier)

    def add(self, other: PrefixStats) -> None:
        """Add ``other``'s tokens to these (totals over requests)."""
        self.prompt_tokens += other.prompt_tokens
        self.reused += other.reused
        self.lost_to_evicted_kv += other.lost_to_evicted_kv
        self.lost_to_swa_window += other.lost_to_swa_window
        self.lost_to_csa_state += other.lost_to_csa_state
        self.reused_from_host += other.reused_from_host
