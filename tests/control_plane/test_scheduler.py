"""Scheduler: token budget, mixed prefill/decode, preemption, abort, rejection, delta tables."""

import pytest

from atom.model_engine.sequence import SequenceStatus


def test_a_step_mixes_a_decode_with_a_chunked_prefill_within_the_budget(harness):
    h = harness(budget=20, overlap=False)  # overlapped, a request added between steps joins one step later
    a = h.add(range(10), max_tokens=5)
    h.step()  # a: whole prompt (10 tokens) and its first token
    b = h.add(range(100, 140), max_tokens=2)
    batch = h.step().batch
    assert [(s.seq_id, s.num_tokens) for s in batch.seqs] == [(a.seq_id, 1), (b.seq_id, 19)]
    assert batch.num_tokens == 20 and not batch.seqs[1].sample
    batch = h.step().batch
    assert [s.num_tokens for s in batch.seqs] == [1, 19]
    batch = h.step().batch
    assert [s.num_tokens for s in batch.seqs] == [1, 2] and batch.seqs[1].sample


def test_no_step_exceeds_the_token_budget_or_the_sequence_limit(harness):
    h = harness(budget=24, max_seqs=3)
    for i in range(7):
        h.add(range(i, i + 30), max_tokens=6)
    while h.sched.has_unfinished():
        batch = h.step().batch
        assert batch.num_tokens <= 24 and len(h.sched.running) <= 3


def test_stop_tokens_and_max_tokens_finish_requests(harness):
    h = harness()
    probe = h.runner.token_for(0, 0)  # the fake runner's tokens are a pure function of (id, position)
    a = h.add(range(20), max_tokens=8, seq_id=1000)
    stop_at = h.runner.token_for(1001, 22)
    b = h.add(range(20), max_tokens=8, seq_id=1001, stop_token_ids=(stop_at,))
    h.run()
    assert probe >= 0
    assert a.status is SequenceStatus.FINISHED_LENGTH and a.num_output_tokens == 8
    assert b.status is SequenceStatus.FINISHED_STOPPED and b.output_token_ids[-1] == stop_at
    assert b.num_output_tokens == 3


def test_preemption_recomputes_the_youngest_request_and_all_requests_complete(harness):
    h = harness(num_chunks=10, budget=64, max_seqs=4, max_model_len=160)
    seqs = [h.add([(13 * i + j) % 997 for j in range(40)], max_tokens=60) for i in range(4)]
    h.run()
    assert h.sched.num_preemptions > 0
    assert all(s.status is SequenceStatus.FINISHED_LENGTH and s.num_output_tokens == 60 for s in seqs)
    tokens = {s.seq_id: s.output_token_ids for s in seqs}
    for s in seqs:  # outputs equal what the deterministic runner gives without any preemption
        assert tokens[s.seq_id] == [h.runner.token_for(s.seq_id, 40 + i) for i in range(60)]
    h.assert_all_memory_returned()


@pytest.mark.parametrize("when", ["waiting", "mid_prefill", "decoding"])
def test_abort_at_any_point_frees_everything(harness, when):
    h = harness(budget=16)
    other = h.add(range(30), max_tokens=3)
    seq = h.add(range(100, 140), max_tokens=10)
    if when != "waiting":
        while seq.status is not SequenceStatus.RUNNING or (when == "decoding" and seq.in_prefill):
            h.step()
    assert h.sched.abort(seq.seq_id)
    assert seq.status is SequenceStatus.FINISHED_ABORTED and seq.seq_id not in h.bm.holdings
    h.sched.check_integrity()
    h.run()
    assert other.status is SequenceStatus.FINISHED_LENGTH
    h.assert_all_memory_returned()
    assert not h.sched.abort(seq.seq_id)


def test_a_request_longer_than_the_model_length_is_refused_with_the_numbers(harness):
    h = harness(max_model_len=64)
    with pytest.raises(ValueError, match=r"60 prompt \+ 10 output tokens = 70, more than the model length 64"):
        h.add(range(60), max_tokens=10)
    assert not h.sched.has_unfinished()


def test_runner_tables_follow_the_scheduler_by_deltas_whose_size_does_not_grow_with_context(harness):
    h = harness(budget=512, max_model_len=2048)
    seq = h.add(range(500), max_tokens=300)
    sizes, checked = [], []

    def runner_table_is_the_schedulers(batch):
        if seq.status is SequenceStatus.RUNNING:
            table, held = h.runner.tables[seq.seq_id], h.held(seq)
            assert table["compress"] == held.comp.pages
            assert table["swa"][:len(held.swa.pages)] == held.swa.pages
            assert all(p == -1 for p in table["swa"][len(held.swa.pages):])
            checked.append(batch.step)

    h.observe(runner_table_is_the_schedulers)
    while h.sched.has_unfinished():
        batch = h.step().batch
        if batch.step > 1:
            sizes.append(len(batch.table_updates))
    assert len(checked) == len(sizes) + 1  # every step, the last one before the request finished
    # the step after the 500-token prefill ships its window releases as one run of -1 entries;
    # every decode step after that changes at most a new compressed + SWA block and one release
    assert sizes[0] == 1
    assert max(sizes[1:]) <= 3
