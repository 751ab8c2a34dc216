"""Every request's final output is streamed exactly once, however it finishes, and finding the
requests that finished outside a step costs O(finished): a step never reads the tracked requests."""

from atom.model_engine.sequence import Sequence, SequenceStatus
from atom.sampling_params import SamplingParams


def final_outputs(engine, steps=None):
    """Step until idle (or ``steps`` times); every finished output, in order."""
    done, n = [], 0
    while engine.has_unfinished_requests() and (steps is None or n < steps):
        done += [o for o in engine.step() if o.finished]
        n += 1
    return done


def hold_the_whole_arena(bm):
    """Admit requests straight into the block manager (never scheduled) until not even one more
    request's first token fits."""
    salt = 0
    for max_new in (512, 1):
        while True:
            salt += 1
            seq = Sequence([salt * 1000 + i for i in range(500)], SamplingParams(max_tokens=1), bm.block_size)
            if not bm.admit(seq, max_new):
                break


def test_a_request_aborted_while_waiting_streams_exactly_one_abort_output(harness):
    h = harness(max_seqs=1)
    h.engine.add_request(list(range(1, 40)), SamplingParams(max_tokens=3))
    rid = h.engine.add_request(list(range(50, 90)), SamplingParams(max_tokens=3))
    h.engine.step()
    assert h.engine.sequence(rid).status is SequenceStatus.WAITING
    assert h.engine.abort_request(rid) and not h.engine.abort_request(rid)
    done = final_outputs(h.engine)
    assert [(o.request_id, o.finish_reason) for o in done] == [(rid, "abort"), ("req-0", "length")]
    assert done[0].prompt_token_ids == list(range(50, 90)) and done[0].output_token_ids == []
    h.assert_all_memory_returned()


def test_a_request_aborted_while_running_streams_exactly_one_abort_output_with_its_tokens(harness):
    h = harness(budget=64)
    rid = h.engine.add_request(list(range(1, 40)), SamplingParams(max_tokens=20))
    streamed = []
    for _ in range(3):
        streamed += h.engine.step()
    assert [o.finished for o in streamed] == [False, False, False]
    assert h.engine.abort_request(rid)
    assert h.bm.holdings == {}  # freed at once, not at the next step
    done = final_outputs(h.engine)
    assert [(o.request_id, o.finish_reason) for o in done] == [(rid, "abort")]
    assert done[0].output_token_ids == [t for o in streamed for t in o.new_token_ids] and len(streamed) == 3
    assert final_outputs(h.engine) == [] and not h.engine.has_unfinished_requests()
    h.assert_all_memory_returned()


def test_a_request_refused_at_admission_streams_exactly_one_abort_output_with_the_reason(harness):
    h = harness()
    hold_the_whole_arena(h.bm)
    rid = h.engine.add_request([7, 8, 9], SamplingParams(max_tokens=2))
    done = final_outputs(h.engine, steps=3)
    assert [(o.request_id, o.finish_reason) for o in done] == [(rid, "abort")]
    assert done[0].error == "the KV arena cannot hold this request's first block even when idle"
    assert not h.engine.has_unfinished_requests()


def test_the_scheduler_lists_only_requests_finished_outside_postprocess_and_only_once(harness):
    h = harness(budget=64)
    stopped = h.add(range(1, 20), max_tokens=2)
    aborted = h.add(range(30, 60), max_tokens=5)
    h.step()
    assert h.sched.abort(aborted.seq_id)
    assert h.sched.take_ended() == [aborted] and h.sched.take_ended() == []
    h.run()
    assert stopped.status is SequenceStatus.FINISHED_LENGTH and h.sched.take_ended() == []


class StatusReadCounter(Sequence):
    """A real sequence that counts how often anything reads its status."""

    reads = 0

    @property
    def status(self) -> SequenceStatus:
        StatusReadCounter.reads += 1
        return self._status

    @status.setter
    def status(self, value: SequenceStatus) -> None:
        self._status = value


def test_a_step_never_reads_the_thousands_of_requests_it_does_not_schedule(harness):
    h = harness(max_seqs=2, budget=64)
    running = [h.add(range(10 * i + 1, 10 * i + 20), max_tokens=50) for i in range(2)]
    idle = [StatusReadCounter([5, 6, 7 + i], SamplingParams(max_tokens=4), h.bm.block_size) for i in range(5000)]
    for seq in idle:
        h.engine.add_sequence(seq)
    StatusReadCounter.reads = 0
    for _ in range(4):
        outs = h.engine.step()  # no integrity check here: that one does read every waiting request
        assert sorted(o.request_id for o in outs) == ["req-0", "req-1"]
    assert StatusReadCounter.reads == 0
    assert all(s.status is SequenceStatus.RUNNING for s in running)
