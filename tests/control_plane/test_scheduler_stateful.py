"""Random traffic with shared prefixes, aborts and preemption: integrity after every step, content
checks on every read, and all memory back at the end."""

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from support.control_plane import make_harness

PREFIXES = [list(range(100, 148)), list(range(300, 332)), [5] * 20]


class TrafficMachine(RuleBasedStateMachine):
    @initialize(full_retain=st.booleans(), chunks=st.integers(8, 30), budget=st.sampled_from([7, 16, 40]),
                window=st.sampled_from([8, 16]))
    def setup(self, full_retain, chunks, budget, window):
        self.h = make_harness(num_chunks=chunks, budget=budget, max_seqs=3, max_model_len=256,
                              full_retain=full_retain, interval=32 if full_retain else 0,
                              spec_overrides={"sliding_window": window})
        self.live = []

    @rule(prefix=st.sampled_from(range(len(PREFIXES))), suffix=st.lists(st.integers(0, 996), max_size=40),
          max_tokens=st.integers(1, 24))
    def add(self, prefix, suffix, max_tokens):
        tokens = PREFIXES[prefix] + suffix
        if len(tokens) + max_tokens <= 256:
            self.live.append(self.h.add(tokens, max_tokens=max_tokens))

    @rule(n=st.integers(1, 4))
    def step(self, n):
        for _ in range(n):
            if self.h.sched.has_unfinished():
                self.h.step()

    @precondition(lambda self: self.live)
    @rule(i=st.integers(0, 100))
    def abort(self, i):
        self.h.sched.abort(self.live[i % len(self.live)].seq_id)

    @invariant()
    def integrity(self):
        if hasattr(self, "h"):
            self.h.sched.check_integrity()

    def teardown(self):
        if hasattr(self, "h"):
            self.h.run()
            self.h.assert_all_memory_returned()


TestTraffic = TrafficMachine.TestCase
TestTraffic.settings = settings(max_examples=40, stateful_step_count=30, deadline=None,
                                suppress_health_check=[HealthCheck.too_slow])
