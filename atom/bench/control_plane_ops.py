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

A run gives one sample per call, in wall-clock nanoseconds (``time.perf_counter_ns``: about 40 ns a
reading on the development machine, against about 500 ns for the process CPU clock, a system call
whose cost moves with the machine's load; a call that loses the CPU mid-way reads high and is left
out by taking the lowest of several runs, see :mod:`atom.bench.control_plane`). A decode step is
timed for all requests at once (one reading at each end, divided by the number of requests: a
sample of about 100 us instead of one of 0.3 us), one sample per step. The calls of a run are the
same from run to run (same prompts, same arena), so the k-th sample of every run measures the same
work. The collector is frozen and off while the calls are timed (:func:`frozen_gc`).

Workloads: ``decode-heavy`` (256 x 4K), ``long-context`` (32 x 128K), ``shared-prefix`` (64 chats of a
shared 4K system prompt + 512 own tokens; the first request publishes the prefix, the rest hit it).
"""

from __future__ import annotations

import gc
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
    """Freeze every object alive (no later collection walks them) and switch the collector off for
    the body; after it, switch the collector back on (if it was on) and unfreeze (only when nothing
    was frozen before: ``gc.unfreeze`` cannot tell a caller's frozen objects from the body's, so a
    caller that froze its own keeps everything frozen).

    Timed calls then carry none of the collector's work: neither a collection of the objects built
    for the run nor one the body's own allocations would trigger (the count of allocations, and so
    where a collection lands, repeats from run to run, so a lowest-of-runs figure would not filter
    it out). The body's garbage is collected after it, outside the timing.

    It collects nothing first: a full collection walks every object of the process, and one right
    before the body left the body's first calls with cold caches. With torch imported (a million
    objects: the vLLM peer imports it) that added 9% to atom's mean step on the shared-prefix trace
    and 3% to vLLM's (measured, docs/benchmarks.md). Callers collect the garbage of earlier work
    before they build what they time, as :func:`atom.bench.control_plane_side._run` does; what is left
    (the building's own garbage) stays frozen until the body ends."""
    was_enabled, was_frozen = gc.isenabled(), gc.get_freeze_count() > 0
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
        if not was_frozen:
            gc.unfreeze()


def measure_ops(w: Workload, block_size: int, decode_steps: int = 8) -> dict[str, list[float]]:
    """One run: operation -> microseconds of each of its calls, in call order (a decode step's
    sample is per request; ``prefill`` is empty for prompts of one chunk)."""
    bm = _block_manager(w, block_size, decode_steps)
    b = bm.block_size
    seqs = [Sequence(_prompt(w, i), SamplingParams(max_tokens=decode_steps + 1), b) for i in range(w.num_seqs)]
    for s in seqs:
        s.hashes_upto((len(s) - 1) // b)
    with frozen_gc():
        t = _timed_ops(bm, seqs, decode_steps)
    bm.check_integrity([])
    return {k: [ns / 1e3 for ns in v] for k, v in t.items()}


def _timed_ops(bm: BlockManager, seqs: list[Sequence], decode_steps: int) -> dict[str, list[float]]:
    """Run every request through admission, its prompt and ``decode_steps`` decode steps, free them
    all, then query and reclaim the cache: wall-clock nanoseconds per timed call (per request for a
    decode step, which is timed for all requests at once)."""
    t: dict[str, list[float]] = {"admit": [], "prefill": [], "decode": [], "free": [], "room": [], "reclaim": []}
    clock = time.perf_counter_ns  # cheap and steady; a call that loses the CPU is dropped by the lowest of runs
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
