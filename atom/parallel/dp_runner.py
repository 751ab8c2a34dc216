"""Rank 0's runner under data-parallel attention: ``D`` replicas step together, each on its own batch.

``config.parallel`` = ``D`` replicas of ``T`` ranks (``world_size = D*T``; replica ``d`` = ranks
``d*T .. d*T+T-1``). Every replica holds its own requests' KV in its own arena (one ``BlockManager`` per
replica on rank 0, same layout everywhere: :func:`atom.parallel.worker.layout_for`), runs attention,
embedding and head over its ``T`` ranks (tensor parallel inside the replica, or whole when ``T = 1``),
and sends its MoE rows to the ranks holding their experts (:mod:`atom.parallel.expert_exchange`).

Each step :meth:`DataParallelRunner.execute_all` broadcasts the list of the ``D`` batches to every rank
(the batches carry their page-table deltas, so the list stays small); rank ``k`` runs
``batches[replica_of(k)]``; each replica's first rank sends its :class:`RunnerOutput` back to rank 0.

Step alignment: the MoE exchange is collective over every rank, so every replica steps every time. A
replica whose batch is None (nothing scheduled) or has no sequence (only releases / table deltas, which
are applied first) runs a **padding step**: every layer's MoE exchange with :data:`PADDING_ROWS` zero row
(token id 0), no attention, no KV page touched, nothing sampled (:meth:`ModelRunner.pad_step`).
:attr:`DataParallelRunner.padding_steps` counts those replica-steps and
:attr:`DataParallelRunner.padding_tokens` their rows (one per padding replica-step, as the engine's replica
statistics count them; in a graphed decode step a padding replica runs the group's bucket of padding rows
instead, :attr:`DataParallelRunner.bucketed_steps` counts those steps).

Exchange mode: every rank picks the same one from the broadcast list (:func:`step_capacity`). A step in
which every replica decodes (each sequence one committed token, plus its drafts) or pads runs the
fixed-capacity exchange (:mod:`atom.parallel.expert_exchange`: no host read, buffers of the largest
decode step, :func:`exchange_capacity`), the precondition for recording a replica's decode step in a CUDA
graph; a step in which any replica runs a prefill chunk runs the counted exchange, which moves only the
rows needed (a chunk's padded buffers would cost ``world``-fold bandwidth) and reads the counts back once
per layer. A runner of bucketed decode steps (``graph`` / ``padded`` mode) runs such a step at the group's
key (:mod:`atom.parallel.dp_graphs`): every replica pads to the largest bucket among them, and a padding
replica runs that bucket of padding rows, so all capture and replay the same graphs together.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Sequence, TextIO

import torch

from atom.config import ParallelConfig
from atom.model_executor.model_runner import ModelRunner
from atom.kernels.backend import value_checks_off
from atom.parallel.dp_graphs import ReplicaDecodeSteps, group_key, replica_decode_steps
from atom.parallel.executor import RankZeroRunner, start_ranks
from atom.parallel.expert_exchange import decode_capacity, set_exchange_capacity
from atom.parallel.process_group import RankGroup
from atom.parallel.sharding import ParameterBytes
from atom.parallel.worker import RankSpec, build_rank_runner
from atom.step_contract import RunnerOutput, ScheduledBatch

__all__ = ["DataParallelRunner", "start_data_parallel_runner", "serve_replica_steps", "replica_step",
           "PADDING_ROWS", "exchange_capacity", "step_capacity"]

#: Rows a padding replica-step sends through each MoE layer's exchange.
PADDING_ROWS = 1

_MIB = 1 << 20


def exchange_capacity(runner: ModelRunner, replica_size: int) -> int:
    """Slots per peer of the fixed-capacity exchange on ``runner``'s group: the rows one rank dispatches in
    the largest decode step (every live request, each with its drafts), the same on every rank (the layout
    is). At least :data:`PADDING_ROWS`."""
    drafts = 0 if runner.mtp is None else runner.mtp.num_tokens
    rows = runner.views.layout.max_live_requests * (1 + drafts)
    return max(decode_capacity(rows, replica_size), PADDING_ROWS)


def step_capacity(batches: Sequence[ScheduledBatch | None], capacity: int, replica_size: int) -> int:
    """The exchange capacity of the step running ``batches`` (one per replica): ``capacity`` when every
    replica pads or decodes (each sequence one committed token, sampled) within it, else 0 (the counted
    exchange). A function of the broadcast list only, so every rank chooses alike."""
    for batch in batches:
        if is_padding(batch):
            continue
        decode = all(s.num_committed == 1 and s.sample for s in batch.seqs)
        if not decode or decode_capacity(batch.num_tokens, replica_size) > capacity:
            return 0
    return capacity


def replica_step(runner: ModelRunner, batch: ScheduledBatch | None, capacity: int = 0,
                 key: tuple[int, int] | None = None) -> RunnerOutput | None:
    """This rank's part of a step: ``batch`` (its replica's), or a padding step when it has no sequence
    (its releases and table deltas still land first). None when ``batch`` is None. ``capacity``: the step's
    exchange capacity (:func:`step_capacity`; 0: counted); ``key``: the group's decode-graph key of the step
    (:func:`atom.parallel.dp_graphs.group_key`; None: eager), the padding step then the key's bucket of
    padding rows through the same graph as the other replicas'."""
    set_exchange_capacity(runner.model, capacity)
    if isinstance(runner.decode, ReplicaDecodeSteps):
        runner.decode.key = key
    if batch is not None and batch.seqs:
        return runner.execute(batch)
    out = None if batch is None else runner.execute(batch)  # no sequence: tables and releases only
    if key is None:
        runner.pad_step(PADDING_ROWS)
    else:
        with torch.no_grad(), value_checks_off():
            runner.decode.run_padding()
    return out


def is_padding(batch: ScheduledBatch | None) -> bool:
    """Whether a replica given ``batch`` runs a padding step."""
    return batch is None or not batch.seqs


class DataParallelRunner(RankZeroRunner):
    """The data plane the data-parallel engine drives (this process is rank 0, replica 0's first rank)."""

    def __init__(self, local: ModelRunner, group: RankGroup, parallel: ParallelConfig, workers: list | None = None,
                 watchdog=None) -> None:
        super().__init__(local, group, workers, watchdog)
        self.parallel = parallel
        self.replicas = parallel.data_parallel_size
        self.padding_steps = 0
        self.padding_tokens = 0
        #: fixed-capacity exchange slots for decode steps (:func:`exchange_capacity`); 0: always counted
        self.capacity = exchange_capacity(local, parallel.tensor_parallel_size)
        #: steps that ran the fixed-capacity exchange
        self.fixed_steps = 0
        #: bucketed decode steps keyed for the whole group (None: eager runner); steps run on it
        self.graphs = replica_decode_steps(local)
        self.bucketed_steps = 0

    def execute_all(self, batches: Sequence[ScheduledBatch | None]) -> list[RunnerOutput | None]:
        """``batches[d]`` is replica ``d``'s step (None: nothing to run; it runs a padding step and its output
        is None). At least one batch is not None. Every rank of every replica steps. Returns each replica's
        :class:`RunnerOutput` (its first rank's; ``logits`` of replicas other than 0 on the CPU), in replica
        order."""
        assert not self._closed, "the runner was closed"
        batches = self._checked(batches)
        self.group.broadcast(batches)
        capacity = step_capacity(batches, self.capacity, self.parallel.tensor_parallel_size)
        key = group_key(self.graphs, batches, capacity > 0)
        self.fixed_steps += capacity > 0
        self.bucketed_steps += key is not None
        own = replica_step(self.local, batches[0], capacity, key)
        outs = self.group.gather(own)
        for batch in batches:
            if is_padding(batch):
                self.padding_steps += 1
                self.padding_tokens += PADDING_ROWS
        t = self.parallel.tensor_parallel_size
        return [own] + [outs[d * t] for d in range(1, self.replicas)]

    def _checked(self, batches: Sequence[ScheduledBatch | None]) -> list[ScheduledBatch | None]:
        batches = list(batches)
        if len(batches) != self.replicas:
            raise ValueError(f"execute_all takes one batch (or None) per replica: got {len(batches)} for "
                             f"{self.replicas} replicas")
        if all(b is None for b in batches):
            raise ValueError("execute_all needs at least one replica's batch; with every replica idle make no call")
        for d, b in enumerate(batches):
            if b is not None and not isinstance(b, ScheduledBatch):
                raise ValueError(f"batches[{d}] is a {type(b).__name__}; accepted: a ScheduledBatch or None")
        return batches


def serve_replica_steps(group: RankGroup, runner: ModelRunner, parallel: ParallelConfig) -> None:
    """The loop of a rank > 0: run its replica's batch of every list rank 0 broadcasts (a padding step when
    it has none), the replica's first rank sending its output back, until rank 0 broadcasts ``None``."""
    replica = parallel.replica_of(group.rank)
    leader = group.rank % parallel.tensor_parallel_size == 0
    capacity, graphs = exchange_capacity(runner, parallel.tensor_parallel_size), replica_decode_steps(runner)
    while True:
        batches = group.broadcast(None)
        if batches is None:
            return
        step = step_capacity(batches, capacity, parallel.tensor_parallel_size)
        out = replica_step(runner, batches[replica], step, group_key(graphs, batches, step > 0))
        group.gather(_on_cpu(out) if leader else None)


def _on_cpu(out: RunnerOutput | None) -> RunnerOutput | None:
    """``out`` with its kept logits on the CPU (they travel to rank 0 pickled)."""
    if out is None or not out.logits:
        return out
    return dataclasses.replace(out, logits={k: v.cpu() for k, v in out.logits.items()})


def start_data_parallel_runner(spec: RankSpec, *, keep_logits: bool = False, group: RankGroup | None = None,
                               out: TextIO = sys.stderr) -> DataParallelRunner:
    """Rank 0 of ``spec.config.parallel`` (``data_parallel_size`` replicas of ``tensor_parallel_size`` ranks):
    spawn and join the workers (or use the launcher's ``group``), build rank 0's shard, report each replica."""
    par = spec.config.parallel
    if par.data_parallel_size < 2:
        raise ValueError(f"data_parallel_size={par.data_parallel_size}: a data-parallel runner needs at least 2 "
                         "replicas (one replica runs through start_parallel_runner)")
    spec = dataclasses.replace(spec, keep_logits=keep_logits)
    group, workers, watchdog = start_ranks(spec, group, out)
    runner, held = build_rank_runner(spec, group, keep_logits=keep_logits)
    report_replicas(par, group.gather(held), runner, out)
    return DataParallelRunner(runner, group, par, workers, watchdog)


def report_replicas(par: ParallelConfig, held: list[ParameterBytes], runner: ModelRunner, out: TextIO) -> None:
    """The start-up lines: the layout, then per replica its ranks, what each holds, and its own KV arena."""
    t, d = par.tensor_parallel_size, par.data_parallel_size
    experts = "whole experts partitioned (expert parallel)" if par.enable_expert_parallel else \
        "every expert split (tensor parallel)"
    attn = "whole attention per rank" if t == 1 or par.replicate_attention else f"attention split over {t} ranks"
    print(f"atom: {d} attention replicas x {t} rank(s) = {d * t} ranks ({attn}; routed experts over all {d * t} "
          f"ranks, {experts}; MoE rows exchanged by all-to-all)", file=out)
    lay = runner.views.layout
    tokens = lay.max_compressed_pages * lay.spec.block_size
    for r in range(d):
        ranks = range(r * t, (r + 1) * t)
        print(f"atom:   replica {r}: ranks {ranks.start}..{ranks.stop - 1}; own scheduler and KV arena "
              f"{lay.arena_bytes / _MIB:.1f} MiB in {lay.num_chunks} chunks (up to {tokens} tokens of compressed KV)",
              file=out)
        for k in ranks:
            h = held[k]
            print(f"atom:     rank {k}: parameters {h.total / _MIB:.2f} MiB = sharded {h.sharded / _MIB:.2f} MiB "
                  f"+ replicated {h.replicated / _MIB:.2f} MiB", file=out)
    print(f"atom:   group KV: {d} replicas x {tokens} = {d * tokens} tokens of compressed KV (each replica holds "
          f"only its own requests)", file=out, flush=True)
