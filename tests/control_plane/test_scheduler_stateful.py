"""Random traffic with shared prefixes, aborts and preemption: integrity after every step, content
checks on every read, runner tables equal to the scheduler's, and all memory back at the end.

Arenas start at the sizing minimum (one request of the model length), with one or two SWA pages per
chunk, so pages of live requests end up scattered over chunks shared with cached ones; no request
that fits the model length may be dropped, and an admission that cannot fit must evict nothing."""

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize, rule

from atom.model_engine.sequence import Sequence, SequenceStatus
from atom.sampling_params import SamplingParams
from support.control_plane import make_harness
from support.traffic_rules import min_chunks, traffic_rules

PREFIXES = [list(range(100, 148)), list(range(300, 332)), [5] * 20]
MAX_LEN = 256


class TrafficMachine(traffic_rules(PREFIXES, MAX_LEN, max_new_tokens=24, long_from=150)):
    @initialize(full_retain=st.booleans(), extra=st.integers(0, 22), budget=st.sampled_from([7, 16, 40]),
                window=st.sampled_from([8, 16, 49]), chunk_pages=st.sampled_from([1, 2]))
    def setup(self, full_retain, extra, budget, window, chunk_pages):
        self.h = make_harness(num_chunks=min_chunks(window, chunk_pages, MAX_LEN) + extra, chunk_pages=chunk_pages,
                              budget=budget, max_seqs=3, max_model_len=MAX_LEN, full_retain=full_retain,
                              interval=32 if full_retain else 0, spec_overrides={"sliding_window": window})
        self.live = []

    @rule(length=st.integers(16, MAX_LEN - 1), first=st.integers(1, MAX_LEN))
    def probe_admission(self, length, first):
        """An admission that fails changes nothing: no cached block evicted, no pin released."""
        bm = self.h.bm
        pending = bm.take_updates()  # the running requests' deltas still owed to the runner
        seq = Sequence([(11 * i + 3) % 997 for i in range(length)], SamplingParams(max_tokens=1), bm.block_size)
        before = (bm.comp.pool.num_cached(), bm.swa.pool.num_cached(), bm.swa.num_pins)
        n = bm.admit(seq, first)
        after = (bm.comp.pool.num_cached(), bm.swa.pool.num_cached(), bm.swa.num_pins)
        assert n > 0 or (after == before and seq.seq_id not in bm.holdings), \
            f"a failed admission changed the cache {before} -> {after}"
        if n:
            bm.free(seq)
        bm.take_updates()  # the probe's own deltas never reach the runner
        bm.updates.extend(pending)

    def teardown(self):
        if hasattr(self, "h"):
            self.h.run()
            dropped = [s for s in self.live if s.status is SequenceStatus.FINISHED_ABORTED]
            assert not dropped, f"requests within the model length were dropped: {[s.error for s in dropped]}"
            self.h.assert_all_memory_returned()


TestTraffic = TrafficMachine.TestCase
TestTraffic.settings = settings(max_examples=40, stateful_step_count=30, deadline=None,
                                suppress_health_check=[HealthCheck.too_slow])
