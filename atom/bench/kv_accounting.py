"""KV memory accounting: exact bytes per token and per request for a KV spec.

Pure functions with no padding or paging in them: what the model *must* keep. The capacity report
(:mod:`atom.bench.capacity`) prints one 1M-token request's exact bytes from them for each geometry,
and the tests reproduce the published DeepSeek-V4 figures (9.62 GiB per 1M-token request for V4-Pro in bf16; 83.9 GiB for a
V3.2-style MLA stack).
"""

from __future__ import annotations

from atom.config import Dsv4KvSpec
from atom.kv_group import is_csa
from atom.validation import require_int

__all__ = ["compressed_bytes_per_token", "request_kv_bytes", "mla_kv_bytes"]


def compressed_bytes_per_token(spec: Dsv4KvSpec) -> float:
    """Steady-state bytes per token of compressed rows plus indexer keys, all layers."""
    return spec.compressed_block_bytes / spec.block_size


def request_kv_bytes(spec: Dsv4KvSpec, num_tokens: int, include_window: bool = True,
                     include_state: bool = False) -> int:
    """Bytes one request of ``num_tokens`` tokens holds.

    Compressed entries ``floor(n / ratio)`` per compressed layer (plus an indexer key per CSA
    entry); with ``include_window`` the last ``min(n, W)`` SWA rows of every layer; with
    ``include_state`` the live compressor state of every compressed layer.
    """
    require_int("num_tokens", num_tokens, 0)
    total = 0
    for layer in spec.compressed_layers:
        ratio = spec.compress_ratios[layer]
        row = spec.main_row_bytes + (spec.index_row_bytes if is_csa(ratio) else 0)
        total += (num_tokens // ratio) * row
    if include_window:
        total += min(num_tokens, spec.sliding_window) * spec.main_row_bytes * spec.num_layers
    if include_state:
        total += spec.request_state_bytes
    return total


def mla_kv_bytes(num_layers: int, kv_dims: int, bytes_per_elem: int, num_tokens: int) -> int:
    """A dense MLA cache (DeepSeek-V3.2 style: every token, every layer, ``kv_dims`` wide)."""
    for name, value in (("num_layers", num_layers), ("kv_dims", kv_dims),
                        ("bytes_per_elem", bytes_per_elem), ("num_tokens", num_tokens)):
        require_int(name, value, 0)
    return num_layers * kv_dims * bytes_per_elem * num_tokens
