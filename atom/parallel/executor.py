"""Rank 0's runner: broadcast each step's frozen batch, run rank 0's shard, return its samples.

:func:`start_parallel_runner` spawns ranks ``1 .. n-1`` with ``torch.multiprocessing`` (or, under
``torchrun``, uses the group the launcher formed), joins them, builds rank 0's shard and reports
what every rank holds. :class:`DistributedRunner` then looks like any runner to ``LLMEngine``:
``execute(batch)`` sends the batch to every rank (the batch carries the page-table deltas, so it
stays small), runs the step on rank 0 and returns rank 0's sampled tokens; every rank computed the
same gathered logits, so one rank's samples are everyone's.

A spawned worker that dies takes the process down: a watchdog thread sees it exit, prints which
rank died and how, stops the other workers and exits with status 1, instead of leaving rank 0
blocked in a collective that can never complete. ``close()`` (also run at exit) stops the workers.
"""

from __future__ import annotations

import atexit
import dataclasses
import multiprocessing.connection
import os
import sys
import threading
from typing import TextIO

import torch

from atom.step_contract import RunnerOutput, ScheduledBatch
from atom.model_executor.model_runner import ModelRunner
from atom.parallel.process_group import RankGroup, free_port, join
from atom.parallel.sharding import ParameterBytes
from atom.parallel.worker import RankSpec, build_rank_runner, worker_main

__all__ = ["RankZeroRunner", "DistributedRunner", "start_parallel_runner", "start_ranks", "WorkerWatchdog"]

_MIB = 1 << 20


class WorkerWatchdog(threading.Thread):
    """Exits the process (status 1) with a clear message when a worker ends before ``stop()``."""

    def __init__(self, workers: list, out: TextIO = sys.stderr) -> None:
        super().__init__(name="atom-worker-watchdog", daemon=True)
        self.workers, self.out = workers, out
        self._stopping = threading.Event()

    def stop(self) -> None:
        self._stopping.set()

    def run(self) -> None:
        pending = {w.sentinel: w for w in self.workers}
        while pending and not self._stopping.is_set():
            for sentinel in multiprocessing.connection.wait(list(pending), timeout=0.5):
                dead = pending.pop(sentinel)
                if self._stopping.is_set():
                    return
                self._fail(dead)

    def _fail(self, dead) -> None:
        dead.join(5)  # reap it, so its exit status is known
        code = dead.exitcode
        how = f"was killed by signal {-code}" if code is not None and code < 0 else f"exited with status {code}"
        print(f"atom: model worker {dead.name} (pid {dead.pid}) {how}; the model cannot run without every "
              f"rank, so the server is shutting down", file=self.out, flush=True)
        for w in self.workers:
            if w is not dead and w.is_alive():
                w.kill()
        os._exit(1)


class RankZeroRunner:
    """Rank 0's side of a group of ranks: its own :class:`ModelRunner`, the group, the spawned workers and
    their watchdog; :meth:`close` stops them all (also run at exit)."""

    def __init__(self, local: ModelRunner, group: RankGroup, workers: list | None = None,
                 watchdog: WorkerWatchdog | None = None) -> None:
        assert group.rank == 0
        self.local, self.group = local, group
        self.workers = workers or []
        self.watchdog = watchdog
        self._closed = False
        atexit.register(self.close)

    @property
    def views(self):
        """Rank 0's arena views (every rank binds the same layout)."""
        return self.local.views

    def close(self, timeout: float = 20.0) -> None:
        """Stop every rank: tell the workers to leave, wait for them, then leave the group."""
        if self._closed:
            return
        self._closed = True
        if self.watchdog is not None:
            self.watchdog.stop()
        try:
            self.group.broadcast(None)
        except RuntimeError:  # a worker is already gone: nothing left to tell
            pass
        for w in self.workers:
            w.join(timeout)
            if w.is_alive():
                w.kill()
                w.join(timeout)
        self.group.leave()


class DistributedRunner(RankZeroRunner):
    """The runner ``LLMEngine`` drives when the model spans several ranks (this process is rank 0)."""

    def execute(self, batch: ScheduledBatch) -> RunnerOutput:
        assert not self._closed, "the runner was closed"
        self.group.broadcast(batch)
        return self.local.execute(batch)


def start_parallel_runner(spec: RankSpec, *, keep_logits: bool = False, group: RankGroup | None = None,
                          out: TextIO = sys.stderr) -> DistributedRunner:
    """Rank 0 of ``spec.config.parallel``: spawn and join the workers (or use the launcher's ``group``)."""
    if spec.config.parallel.data_parallel_size > 1:
        raise ValueError("data_parallel_size > 1 runs through atom.parallel.dp_runner.start_data_parallel_runner")
    spec = dataclasses.replace(spec, keep_logits=keep_logits)
    group, workers, watchdog = start_ranks(spec, group, out)
    runner, held = build_rank_runner(spec, group, keep_logits=keep_logits)
    report(spec, group.gather(held), runner, out)
    return DistributedRunner(runner, group, workers, watchdog)


def start_ranks(spec: RankSpec, group: RankGroup | None, out: TextIO
                ) -> tuple[RankGroup, list, WorkerWatchdog | None]:
    """Rank 0's group: spawn ranks ``1 .. n-1`` (each runs :func:`worker_main`) under a watchdog and join
    them, or take the launcher's ``group``; CPU ranks get their share of the cores."""
    size = spec.config.parallel.world_size
    workers: list = []
    watchdog = None
    if torch.device(spec.device).type == "cpu":
        limit_cpu_threads(size)
    if group is None:
        init_method = f"tcp://127.0.0.1:{free_port()}"
        ctx = torch.multiprocessing.get_context("spawn")
        for rank in range(1, size):
            w = ctx.Process(target=worker_main, args=(spec, rank, size, init_method, os.getpid()),
                            name=f"rank {rank}", daemon=True)
            w.start()
            workers.append(w)
        watchdog = WorkerWatchdog(workers, out)
        watchdog.start()
        print(f"atom: started {size - 1} model worker(s): " + ", ".join(f"{w.name} pid {w.pid}" for w in workers),
              file=out, flush=True)
        group = join(0, size, init_method, spec.device)
    return group, workers, watchdog


def limit_cpu_threads(ranks: int) -> None:
    """Give each CPU rank its share of the cores: oversubscribed OpenMP threads spin while a peer
    rank waits in a collective, which slows a step down by an order of magnitude."""
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // ranks))


def report(spec: RankSpec, held: list[ParameterBytes], runner: ModelRunner, out: TextIO) -> None:
    """The start-up lines: what each rank holds, and the per-rank KV capacity (replicated KV)."""
    par = spec.config.parallel
    mode = "expert parallel" if par.enable_expert_parallel else "tensor-parallel experts"
    attn = "replicated attention" if par.replicate_attention else "tensor-parallel attention"
    print(f"atom: {len(held)} ranks ({attn}, {mode}, vocab-parallel embedding and head)", file=out)
    for rank, h in enumerate(held):
        print(f"atom:   rank {rank}: parameters {h.total / _MIB:.2f} MiB = sharded {h.sharded / _MIB:.2f} MiB "
              f"+ replicated {h.replicated / _MIB:.2f} MiB", file=out)
    lay = runner.views.layout
    tokens = lay.max_compressed_pages * lay.spec.block_size
    print(f"atom:   KV arena per rank (--kv-cache-memory is per rank): {lay.arena_bytes / _MIB:.1f} MiB in "
          f"{lay.num_chunks} chunks, up to {tokens} tokens of compressed KV; the latent KV is one head, so every "
          f"rank holds the full KV of every request and the group's capacity equals one rank's", file=out, flush=True)
