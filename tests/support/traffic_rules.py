"""The random-traffic rules shared by the stateful scheduler tests (device arenas alone, and with a host tier).

Both state machines send the same kinds of traffic at a :class:`~support.control_plane.Harness`: prompts
that share one of a few prefixes, long prompts that press on the arena, engine steps, and aborts, with the
scheduler's ``check_integrity`` after every step. What differs between them (the prefixes, how long a
prompt counts as long, how many tokens a request may decode) is a parameter of :func:`traffic_rules`, so
each keeps its own traffic mix while the rule bodies live here once.
"""

from __future__ import annotations

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from atom.config import CacheConfig, Dsv4KvSpec
from atom.kv.kv_layout import chunk_shape, request_chunks_needed
from support.control_plane import TINY


def min_chunks(window: int, chunk_pages: int, max_len: int) -> int:
    """The sizing minimum of the tiny spec with SWA ``window``: the arena chunks one request of ``max_len``
    tokens needs when a chunk holds ``chunk_pages`` SWA pages."""
    spec = Dsv4KvSpec(**{**TINY, "sliding_window": window})
    pages = chunk_shape(spec, CacheConfig(chunk_pages=chunk_pages)).compress_pages_per_chunk
    return request_chunks_needed(pages, spec, max_len)


def traffic_rules(prefixes: list[list[int]], max_len: int, max_new_tokens: int,
                  long_from: int) -> type[RuleBasedStateMachine]:
    """A state-machine base class with the shared traffic rules.

    A subclass's ``@initialize`` rule sets ``self.h`` (a harness) and ``self.live = []`` (the requests not
    yet aborted, which its teardown checks). The rules: ``add`` a prompt of one of ``prefixes`` plus a random
    suffix decoding up to ``max_new_tokens`` tokens (skipped when it would not fit ``max_len``), ``add_long``
    a prompt of ``long_from`` to ``max_len - 1`` tokens decoding one token, ``step`` the engine 1-4 times
    while work is left, and ``abort`` a live request; the invariant checks the scheduler's integrity.
    """

    class TrafficRules(RuleBasedStateMachine):
        @rule(prefix=st.sampled_from(range(len(prefixes))), suffix=st.lists(st.integers(0, 996), max_size=40),
              max_tokens=st.integers(1, max_new_tokens))
        def add(self, prefix, suffix, max_tokens):
            tokens = prefixes[prefix] + suffix
            if len(tokens) + max_tokens <= max_len:
                self.live.append(self.h.add(tokens, max_tokens=max_tokens))

        @rule(length=st.integers(long_from, max_len - 1))
        def add_long(self, length):
            self.live.append(self.h.add([(7 * i + length) % 997 for i in range(length)], max_tokens=1))

        @rule(n=st.integers(1, 4))
        def step(self, n):
            for _ in range(n):
                if self.h.sched.has_unfinished():
                    self.h.step()

        @precondition(lambda self: self.live)
        @rule(i=st.integers(0, 100))
        def abort(self, i):
            seq = self.live.pop(i % len(self.live))
            self.h.sched.abort(seq.seq_id)

        @invariant()
        def integrity(self):
            if hasattr(self, "h"):
                self.h.sched.check_integrity()

    return TrafficRules
