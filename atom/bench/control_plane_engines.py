"""The two KV-cache managers a control-plane trace is replayed on: atom's and vLLM's.

:class:`AtomReplay` drives :class:`atom.kv.block_manager.BlockManager` as atom's scheduler does
(``admit_unless_waiting``: the wait for a prefix being computed, then ``admit``, with one prefix
match for both; ``grow`` before the step, ``after_step`` after it, ``take_updates`` once a step,
``ship_tables`` for a new request), on V4-Flash geometry with an arena sized to hold every request. Like the scheduler, it keeps a request waiting while a running request
computes the next block of its prompt (it then hits that block a step later instead of computing
it again).

:class:`VllmReplay` drives vLLM's ``KVCacheManager`` as vLLM's scheduler does
(``get_computed_blocks`` + ``allocate_slots`` at admission, then ``record_prefix_cache_stats``;
``allocate_slots`` per step; the block ids of a new request's tables and of each step's new blocks;
``free``; and once a step the manager's queues the scheduler drains: ``new_step_starts``, the
boundary-state offloads, the block copies, the new block ids, the KV events and the prefix-cache
stats), with statistics on (``log_stats``, as vLLM serves by default). Layout mapping: V4-Flash's
compressed layers keep KV for the whole context, one block per ``block_size`` tokens: they map to a
``FullAttentionSpec`` group; its sliding-window layers map to a ``SlidingWindowSpec`` group with
the same window (128 tokens); both groups share one pool of blocks of the same size, as vLLM's hybrid
allocator requires. Atom's per-request compressor-state page has no vLLM counterpart in this
mapping (atom does that work in addition). Block hashes use vLLM's default (``sha256``); hashes of
prompt blocks are computed when the requests are built, outside the timing, as on atom's side.
vLLM is imported only here, and only when a :class:`VllmReplay` is built.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from atom.bench.control_plane_ops import Workload, _block_manager
from atom.bench.control_plane_trace import CHUNK, Trace, prompt_tokens
from atom.model_engine.sequence import Sequence
from atom.models.deepseek_v4.config import DeepseekV4Config
from atom.sampling_params import SamplingParams

__all__ = ["AtomReplay", "VllmReplay", "peer_missing"]


def peer_missing() -> str | None:
    """None when vLLM's KV-cache manager can be imported, else why not (the import error)."""
    if importlib.util.find_spec("vllm") is None:
        return "vllm is not installed (see atom/bench/install_peer.sh)"
    try:
        import vllm.v1.core.kv_cache_manager  # noqa: F401
    except Exception as e:  # any failure of vLLM's import chain means: no peer
        return f"vllm is installed but its KV-cache manager does not import: {type(e).__name__}: {e}"
    return None


class AtomReplay:
    """Atom's block manager under a trace (see the module docstring)."""

    name = "atom"

    def __init__(self, trace: Trace, block_size: int, decode_steps: int) -> None:
        self.bm = _block_manager(Workload(trace.name, trace.num_seqs, trace.context, trace.shared),
                                 block_size, decode_steps)
        b = self.bm.block_size
        self.seqs = [Sequence(prompt_tokens(trace, i), SamplingParams(max_tokens=decode_steps + 1), b)
                     for i in range(trace.num_seqs)]
        for s in self.seqs:
            s.hashes_upto(len(s) // b)

    def admit(self, i: int, max_new: int) -> tuple[int, int] | None:
        s = self.seqs[i]
        n = self.bm.admit_unless_waiting(s, max_new)
        if n is None:
            return None
        assert n > 0, "the arena was sized to hold every request"
        self.bm.ship_tables(s.seq_id)
        return s.num_computed_tokens, n

    def grow(self, i: int, max_new: int, prefill: bool) -> int:
        s = self.seqs[i]
        if s.seq_id not in self.bm.holdings:
            return 0  # its admission is deferred
        n = min(max_new, s.num_prompt_tokens - s.num_computed_tokens) if prefill else 1
        if n <= 0:
            return 0
        self.bm.grow(s, n)
        return n

    def after(self, i: int, tokens: int) -> None:
        s = self.seqs[i]
        s.num_computed_tokens += tokens
        if s.num_computed_tokens == len(s):
            s.append_token(len(s) % 50000 + 1)
        self.bm.after_step(s)

    def end_step(self) -> None:
        self.bm.take_updates()

    def free(self, i: int) -> None:
        self.bm.free(self.seqs[i])


class VllmReplay:
    """vLLM's ``KVCacheManager`` under a trace (see the module docstring)."""

    name = "vLLM"

    def __init__(self, trace: Trace, block_size: int, decode_steps: int) -> None:
        import torch
        from vllm.sampling_params import SamplingParams as VllmParams
        from vllm.utils.hashing import sha256
        from vllm.v1.core.kv_cache_manager import KVCacheManager
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.kv_cache_interface import (FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec,
                                                SlidingWindowSpec)
        from vllm.v1.request import Request, RequestStatus

        window = DeepseekV4Config.from_preset("deepseek_v4_flash").kv_spec(block_size=block_size).sliding_window
        init_none_hash(sha256)
        row = dict(block_size=block_size, num_kv_heads=1, head_size=512, dtype=torch.uint8)
        groups = [KVCacheGroupSpec(["compressed"], FullAttentionSpec(**row)),
                  KVCacheGroupSpec(["sliding_window"], SlidingWindowSpec(**row, sliding_window=window))]
        max_len = trace.context + decode_steps + 1
        per_req = -(-max_len // block_size) + -(-(CHUNK + window) // block_size) + 2
        config = KVCacheConfig(num_blocks=trace.num_seqs * per_req + 16, kv_cache_tensors=[], kv_cache_groups=groups)
        self.kv = KVCacheManager(config, max_model_len=max_len, scheduler_block_size=block_size,
                                 hash_block_size=block_size, max_in_flight_tokens=CHUNK + trace.num_seqs,
                                 enable_caching=True, log_stats=True)
        self.stats_hits = 0  # hit tokens of the prefix-cache stats drained once a step (a metrics logger's sum)
        hasher = get_request_block_hasher(block_size, sha256)
        params = VllmParams(max_tokens=decode_steps + 1)
        self.reqs = [Request(str(i), prompt_tokens(trace, i), params, None, block_hasher=hasher)
                     for i in range(trace.num_seqs)]
        self._running = RequestStatus.RUNNING
        self.kv.new_step_starts()  # (the scheduler calls it as each step starts; end_step, for the next)

    def admit(self, i: int, max_new: int) -> tuple[int, int]:
        r = self.reqs[i]
        blocks, hit, _ = self.kv.get_computed_blocks(r)
        n = min(max_new, r.num_prompt_tokens - hit)
        new = self.kv.allocate_slots(r, n, hit, blocks)
        assert new is not None, "the pool was sized to hold every request"
        self.kv.record_prefix_cache_stats(r, hit)
        r.status = self._running
        r.num_computed_tokens = hit
        self.kv.get_block_ids(r.request_id)  # a new request's tables, as the scheduler ships them
        return hit, n

    def grow(self, i: int, max_new: int, prefill: bool) -> int:
        r = self.reqs[i]
        n = min(max_new, r.num_prompt_tokens - r.num_computed_tokens) if prefill else 1
        if n <= 0:
            return 0
        new: Any = self.kv.allocate_slots(r, n)
        assert new is not None, "the pool was sized to hold every request"
        new.get_block_ids(allow_none=True)
        return n

    def after(self, i: int, tokens: int) -> None:
        r = self.reqs[i]
        r.num_computed_tokens += tokens
        if r.num_computed_tokens == r.num_tokens:
            r.append_output_token_ids(r.num_tokens % 50000 + 1)

    def end_step(self) -> None:
        kv = self.kv
        kv.take_boundary_state_offloads()
        kv.take_kv_cache_block_copies()
        kv.take_new_block_ids()
        kv.take_events()
        self.stats_hits += kv.make_prefix_cache_stats().hits
        kv.new_step_starts()

    def free(self, i: int) -> None:
        self.kv.free(self.reqs[i])
