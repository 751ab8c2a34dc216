"""Which graph key every replica runs a data-parallel step at (``dp_graphs.group_key``): the largest bucket
and context bucket among the replicas' decode batches, padding replicas following; no key (every replica
eager) with a prefill chunk anywhere, a counted exchange or nothing but padding; and the buffers pad a
replica's own batch to the group's key."""

from __future__ import annotations

import pytest

from atom.model_executor.decode_graphs import DecodeSteps
from atom.model_ops.decode_buffers import DecodeBuffers
from atom.parallel.dp_graphs import ReplicaDecodeSteps, group_key
from atom.sampling_params import SamplingParams
from atom.step_contract import ScheduledBatch, ScheduledSeq

MAX_LEN = 4096


def batch(*starts: int, tokens: int = 1) -> ScheduledBatch:
    """Requests at ``starts`` running ``tokens`` tokens each (1: a decode step)."""
    seqs = tuple(ScheduledSeq(i, start, (5,) * tokens, True, i, False, -1, SamplingParams())
                 for i, start in enumerate(starts))
    return ScheduledBatch(0, seqs, (), (), ())


@pytest.fixture
def steps() -> ReplicaDecodeSteps:
    buffers = DecodeBuffers(8, (0, 4, 128), MAX_LEN, 0)
    return ReplicaDecodeSteps(DecodeSteps(lambda step: None, buffers, capture=False))


def test_every_replica_takes_the_largest_bucket_and_context_among_the_decode_batches(steps):
    # 3 requests: bucket 4, context 1024 (longest 700 + 1); 1 request: bucket 1, context 2048 (1500 + 1)
    assert group_key(steps, [batch(10, 700, 30), batch(1500)], True) == (4, 2048)
    assert group_key(steps, [None, batch(10, 20), batch(tokens=1)], True) == (2, 256)  # padding replicas follow
    assert steps.own_key(batch(10, 20)) == (2, 256)


def test_a_prefill_chunk_a_counted_exchange_or_only_padding_leave_every_replica_eager(steps):
    assert group_key(steps, [batch(10, 700), batch(0, tokens=7)], True) is None
    assert group_key(steps, [batch(10, 700), batch(1500)], False) is None
    assert group_key(steps, [None, batch()], True) is None
    assert group_key(None, [batch(10)], True) is None


def test_the_buffers_pad_a_replica_batch_to_the_group_key(steps):
    steps.key = (8, 2048)
    assert steps.buffers.bucket_for(batch(10, 20)) == 8 and steps.buffers.context_for(batch(10, 20)) == 2048
    assert steps.buffers.bucket_for(batch(0, tokens=7)) is None  # not a decode step: never bucketed
    steps.key = None
    assert steps.run(batch(10, 20), tables=None) is None  # no group key: the step runs eagerly
