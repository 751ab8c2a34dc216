"""Decode graphs under data-parallel attention: every replica captures and replays at the same steps.

A graph recorded with collectives in it must be captured and replayed by every rank of the group together
(a captured collective runs only when the graph is replayed, so a rank running eagerly meanwhile would wait
for a peer that never sends). One replica's :class:`~atom.model_executor.decode_graphs.DecodeSteps` picks
its graph from its own batch (batch bucket, context bucket), so replicas running different batches would
capture at different steps. :class:`ReplicaDecodeSteps` takes the key from the group instead: for a step in
which every replica's batch is a bucketed decode step or padding (and the MoE exchange runs at fixed
capacity, so the recorded forward reads nothing back), every rank computes the same key from the broadcast
batches (:func:`group_key`: the largest bucket and the longest context bucket among them); each replica
pads its own batch to that key, and a replica with nothing to run replays the key's graph on padding-only
inputs (which write nothing into the arena). So every rank sees the same sequence of keys, captures each on
the same step (the two warm-ups and the capture alike) and replays the same graph's collectives as its
peers. Any other step (a prefill chunk anywhere, a request just admitted) runs eagerly on every replica.
"""

from __future__ import annotations

from atom.model_executor.decode_graphs import DecodedStep, DecodeSteps
from atom.model_ops.step_inputs import PageTables
from atom.step_contract import ScheduledBatch

__all__ = ["ReplicaDecodeSteps", "group_key", "replica_decode_steps"]

Key = tuple[int, int]


class ReplicaDecodeSteps(DecodeSteps):
    """:class:`DecodeSteps` of one replica whose key is set for the whole group before each step
    (:attr:`key`; None: the step runs eagerly)."""

    def __init__(self, base: DecodeSteps) -> None:
        super().__init__(base.forward, base.buffers, capture=base.capture, keep=base.keep, restore=base.restore)
        self.key: Key | None = None
        buffers = self.buffers
        self.own_bucket, self.own_context = buffers.bucket_for, buffers.context_for
        # the buffers pad a batch to the group's key: fill() and run() ask these
        buffers.bucket_for = lambda batch: None if self.own_bucket(batch) is None else self._key()[0]
        buffers.context_for = lambda batch: self._key()[1]

    def _key(self) -> Key:
        assert self.key is not None, "a bucketed data-parallel step runs with the group's key set"
        return self.key

    def run(self, batch: ScheduledBatch, tables: PageTables) -> DecodedStep | None:
        """The step of ``batch`` padded to the group's :attr:`key`, or None (eager) when the group's step is
        not bucketed."""
        if self.key is None:
            return None
        return super().run(batch, tables)

    def run_padding(self) -> None:
        """This replica's part of a bucketed step it has no batch for: the forward of the key's bucket on
        padding-only inputs (replayed from the key's graph, captured on first use like every replica's)."""
        size, context = self._key()
        if not self.capture:
            self.buffers.pad(size)
            self.forward(self.buffers.inputs(size, context))
            return
        if self.key not in self.graphs:
            self.graphs[self.key] = self._capture(size, context)
        self.buffers.pad(size)
        self.graphs[self.key].graph.replay()

    def own_key(self, batch: ScheduledBatch) -> Key | None:
        """The key ``batch`` alone would take (its bucket and context bucket), or None when it is not a bucketed
        decode step."""
        size = self.own_bucket(batch)
        return None if size is None else (size, self.own_context(batch))


def replica_decode_steps(runner) -> ReplicaDecodeSteps | None:
    """Make ``runner``'s bucketed decode steps follow the group's key (:class:`ReplicaDecodeSteps`; idempotent);
    None when the runner runs every step eagerly."""
    decode = runner.decode
    if decode is None or isinstance(decode, ReplicaDecodeSteps):
        return decode
    runner.decode = ReplicaDecodeSteps(decode)
    return runner.decode


def group_key(decode: ReplicaDecodeSteps | None, batches: list[ScheduledBatch | None], fixed: bool) -> Key | None:
    """The key every replica runs the step of ``batches`` at: the largest bucket and context bucket of the
    replicas' batches when each is a bucketed decode step or has no sequence (padding), at least one has
    sequences and the exchange runs at fixed capacity (``fixed``: a counted exchange reads its counts back,
    which no graph may hold); else None (every replica eager)."""
    if decode is None or not fixed:
        return None
    keys = []
    for batch in batches:
        if batch is None or not batch.seqs:
            continue
        key = decode.own_key(batch)
        if key is None:
            return None
        keys.append(key)
    if not keys:
        return None
    return max(k[0] for k in keys), max(k[1] for k in keys)
