"""Control-plane cost per operation: admission, an 8K prefill chunk, a decode step, freeing a request,
and the two eviction queries that run when an allocation finds the arena full.

Each workload keeps all its requests live at once on an arena sized to hold them (V4-Flash geometry,
fp8 rows; the control plane allocates no tensors) and times the block manager alone:

- ``admit``: :meth:`BlockManager.admit` of a request (prefix match, claim, pages for its first chunk
  of up to 8,192 tokens). Block hashes are computed when the request arrives, outside the timing.
- ``prefill``: one further 8,192-token chunk (``grow`` + ``after_step``), long prompts only.
- ``decode``: one decode step of one request (``grow`` + ``after_step``), per request (see below).
- ``free``: :meth:`BlockManager.free` of a request at its full context.
- ``room``: once every request is freed (the whole arena cached),
  :meth:`BlockPool.kept_after_eviction` of the compressed pool: what the exact "can eviction make
  room" test asks each owner when a request does not fit.
- ``reclaim``: then :meth:`BlockPool.reclaim_chunk` of the compressed pool, one chunk at a time
  (``RECLAIMS`` calls, fewer when the pool owns fewer chunks): how a chunk is taken back from the
  cache to be lent to the other owner.

Figures are medians over every call of the run, in this process's CPU time; a decode step is timed
for all requests at once (one clock reading at each end, divided by the number of requests: a
reading costs about as much as one request's decode, and that cost moves with the machine's load),
and ``decode`` is the median over the steps. The collector is frozen while the calls are timed
(:func:`frozen_gc`): the requests built for the run are not walked again mid-way, so a collection
of the whole heap lands in no timed call.

Workloads: ``decode-heavy`` (256 x 4K), ``long-context`` (32 x 128K), ``shared-prefix`` (64 chats of a
shared 4K system prompt + 512 own tokens; the first request publishes the prefix, the rest hit it).
"""

from __future__ import annotations

import gc
import statistics
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

from atom.config import CacheConfig, SchedulerConfig
from atom.kv.block_manager import BlockManager
from atom.kv.kv_layout import KvLayout, chunk_shape
from atom.model_engine.sequence import Sequence
from atom.models.deepseek_v4.config import DeepseekV4Config
from atom.sampling_params import SamplingParams

__all__ = ["Workload", "WORKLOADS", "frozen_gc", "measure_ops"]

CHUNK = 8192
RECLAIMS = 16


@dataclass(frozen=True)
class Workload:
    name: str
    num_seqs: int
    context: int  # prompt tokens per request
    shared: int = 0  # leading tokens every prompt shares


WORKLOADS = (Workload("decode-heavy", 256, 4096), Workload("long-context", 32, 131072),
             Workload("shared-prefix", 64, 4096 + 512, shared=4096))


def _prompt(w: Workload, i: int) -> list[int]:
    own = [(i * 7919 + j * 31) % 50000 + 1 for j in range(w.context - w.shared)]
    return [(j * 13) % 50000 + 1 for j in range(w.shared)] + own


def _block_manager(w: Workload, block_size: int, decode_steps: int) -> BlockManager:
    spec = DeepseekV4Config.from_preset("deepseek_v4_flash").kv_spec(block_size=block_size)
    max_len = w.context + decode_steps + 1
    limits = SchedulerConfig(max_num_batched_tokens=CHUNK, max_num_seqs=w.num_seqs, max_model_len=max_len)
    cache = CacheConfig(block_size=spec.block_size)
    shape = chunk_shape(spec, cache)
    comp = w.num_seqs * (-(-max_len // spec.block_size))
    swa = w.num_seqs * (spec.tail_blocks + 2 + CHUNK // spec.block_size)
    chunks = -(-comp // shape.compress_pages_per_chunk) + -(-swa // shape.chunk_pages) + w.num_seqs + 2  # + state
    return BlockManager(KvLayout.for_chunks(spec, chunks, limits, cache), cache)


@contextmanager
def frozen_gc() -> Iterator[None]:
    """Collect garbage, then freeze every object alive (the collector no longer walks them) for the
    body; unfreeze after. Objects the body creates are collected as usual."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def measure_ops(w: Workload, block_size: int, decode_steps: int = 8) -> dict[str, float]:
    """Median microseconds per call of each operation (``prefill`` is NaN for prompts of one chunk).

    The median, not the mean: on a shared machine a call that loses the CPU mid-way would otherwise
    dominate; amortized costs (a list or dict growing) are therefore under-weighted."""
    bm = _block_manager(w, block_size, decode_steps)
    b = bm.block_size
    seqs = [Sequence(_prompt(w, i), SamplingParams(max_tokens=decode_steps + 1), b) for i in range(w.num_seqs)]
    for s in seqs:
        s.hashes_upto((len(s) - 1) // b)
    with frozen_gc():
        t = _timed_ops(bm, seqs, decode_steps)
    bm.check_integrity([])
    return {k: statistics.median(v) / 1e3 if v else float("nan") for k, v in t.items()}


def _timed_ops(bm: BlockManager, seqs: list[Sequence], decode_steps: int) -> dict[str, list[float]]:
    """Run every request through admission, its prompt and ``decode_steps`` decode steps, free them
    all, then query and reclaim the cache: CPU nanoseconds per timed call (per request for a decode
    step, which is timed for all requests at once)."""
    t: dict[str, list[float]] = {"admit": [], "prefill": [], "decode": [], "free": [], "room": [], "reclaim": []}
    clock = time.process_time_ns  # CPU time: other processes on a shared machine do not inflate it
    for s in seqs:
        t0 = clock()
        n = bm.admit(s, CHUNK)
        t["admit"].append(clock() - t0)
        assert n > 0, "the arena was sized to hold every request"
        s.num_computed_tokens += n
        bm.after_step(s)
        while s.num_remaining > 1:
            n = min(CHUNK, s.num_remaining - 1)
            t0 = clock()
            bm.grow(s, n)
            s.num_computed_tokens += n
            bm.after_step(s)
            if n == CHUNK:
                t["prefill"].append(clock() - t0)
    for step in range(decode_steps):
        t0 = clock()
        for s in seqs:
            bm.grow(s, 1)
            s.num_computed_tokens += 1
            s.append_token(step + 1)
            bm.after_step(s)
        t["decode"].append((clock() - t0) / len(seqs))
    for s in seqs:
        t0 = clock()
        bm.free(s)
        t["free"].append(clock() - t0)
    pool = bm.comp.pool
    for _ in range(min(RECLAIMS, bm.arena.owned_chunks(pool.owner))):
        t0 = clock()
        pool.kept_after_eviction([])
        t["room"].append(clock() - t0)
        t0 = clock()
        reclaimed = pool.reclaim_chunk()
        t["reclaim"].append(clock() - t0)
        assert reclaimed, "every used page is cached once all requests are freed"
    return t
