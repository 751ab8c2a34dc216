"""The replica router: each policy's choice, its tie-breaks, sticky sessions; and the read-only prefix
probe it asks each replica (BlockManager.cached_prefix_tokens), checked against real admissions."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from atom.model_engine.router import POLICIES, ReplicaRouter, SchedulerView
from support.control_plane import make_harness


@dataclass
class View:
    """A replica as the router sees it: a cached prefix per prompt (keyed by its first token)."""

    hits: dict[int, int] = field(default_factory=dict)
    free: int = 0
    waiting: int = 0
    running: int = 0
    asked: int = 0

    def cached_prefix_tokens(self, token_ids):
        self.asked += 1
        return self.hits.get(token_ids[0], 0)

    def free_arena_bytes(self):
        return self.free

    def waiting_tokens(self):
        return self.waiting

    def running_tokens(self):
        return self.running


PROMPT = [7] * 40


# ---- policies -----------------------------------------------------------------------------------
def test_the_prefix_policy_picks_the_replica_holding_the_longest_cached_prefix():
    views = [View({7: 16}, free=900), View({7: 32}, free=100, waiting=10), View({7: 16}, free=1000)]
    assert ReplicaRouter("prefix").route(PROMPT, views) == 1  # gains 16, 22, 16


def test_a_prefix_tie_goes_to_the_most_free_arena_then_the_fewest_waiting_tokens_then_the_lowest_index():
    router = ReplicaRouter()
    assert router.policy == "prefix"
    assert router.route(PROMPT, [View({7: 32}, free=10), View({7: 32}, free=20), View({7: 16}, free=99)]) == 1
    # equal gains (32 - 9 = 29 - 6): the fewer waiting tokens
    assert router.route(PROMPT, [View({7: 32}, free=20, waiting=9), View({7: 29}, free=20, waiting=6)]) == 1
    assert router.route(PROMPT, [View({7: 32}, free=20, waiting=3), View({7: 32}, free=20, waiting=3)]) == 0


def test_a_longer_prefix_wins_over_a_less_loaded_replica_only_when_it_saves_more_tokens_than_the_load_gap():
    router = ReplicaRouter("prefix")
    # replica 0 holds 4096 more tokens of the prompt; its requests hold 4000 more tokens: 96 > 0
    assert router.route(PROMPT, [View({7: 4096}, running=3000, waiting=1000), View(running=0)]) == 0
    assert router.route(PROMPT, [View({7: 4096}, running=4000, waiting=1000), View(running=0)]) == 1  # -904 < 0
    assert router.route(PROMPT, [View({7: 4096}, waiting=5000), View(running=0)]) == 1  # queued tokens weigh too
    # an exact tie of gains (4096 - 4096 = 0 - 0) goes to the more free arena
    assert router.route(PROMPT, [View({7: 4096}, running=4096, free=1), View(free=2)]) == 1
    assert router.route(PROMPT, [View({7: 64}, running=10, free=3), View({7: 80}, running=30, free=2),
                                 View({7: 80}, running=20, waiting=6, free=4)]) == 2  # gains 54, 50, 54: more free


def test_a_miss_everywhere_on_equally_loaded_replicas_goes_to_the_most_free_arena_then_the_fewest_waiting():
    views = [View(free=5), View(free=50), View(free=50), View({1: 64}, free=80)]
    assert ReplicaRouter("prefix").route(PROMPT, views) == 3  # replica 3 holds another prompt: still a miss here
    views = [View(free=90, running=1), View(free=50, running=2, waiting=7), View(free=50, running=7, waiting=2)]
    assert ReplicaRouter("prefix").route(PROMPT, views) == 0  # the least load first: gains -1, -9, -9
    views[0].running, views[0].free = 9, 10
    assert ReplicaRouter("prefix").route(PROMPT, views) == 2  # all -9: most free arena (50, 50), fewer waiting


def test_least_loaded_ignores_the_cache_and_takes_the_most_free_arena_then_the_fewest_waiting_tokens():
    views = [View({7: 32}, free=10), View(free=30, waiting=4), View(free=30, waiting=1), View(free=29)]
    router = ReplicaRouter("least-loaded")
    assert router.route(PROMPT, views) == 2
    assert [v.asked for v in views] == [0, 0, 0, 0]
    assert router.route(PROMPT, [View(free=30), View(free=30)]) == 0


def test_round_robin_cycles_through_the_replicas_whatever_they_hold():
    views = [View({7: 32}, free=99), View(), View()]
    router = ReplicaRouter("round-robin")
    assert [router.route(PROMPT, views, session="s") for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    assert router.route(PROMPT, views[:2]) == 1  # the cycle continues over however many replicas are offered


# ---- sessions -----------------------------------------------------------------------------------
def test_a_session_goes_back_to_its_replica_even_when_another_holds_a_longer_prefix():
    router = ReplicaRouter("prefix")
    views = [View(free=10), View(free=20)]
    assert router.route(PROMPT, views, session="alice") == 1
    views[0].hits[7], views[0].free = 64, 1000
    assert router.route(PROMPT, views, session="alice") == 1
    assert router.route(PROMPT, views, session="bob") == 0  # a new session is routed by its prefix
    assert router.session_replica("alice") == 1 and router.session_replica("bob") == 0
    router.forget("alice")
    router.forget("nobody")  # unknown: ignored
    assert router.session_replica("alice") is None
    assert router.route(PROMPT, views, session="alice") == 0


def test_sessions_are_not_sticky_under_the_cache_blind_policies():
    router = ReplicaRouter("least-loaded")
    views = [View(free=10), View(free=20)]
    assert router.route(PROMPT, views, session="alice") == 1
    views[0].free = 30
    assert router.route(PROMPT, views, session="alice") == 0


def test_the_session_table_forgets_the_least_recently_routed_session_past_its_bound():
    router = ReplicaRouter("prefix", max_sessions=2)
    views = [View(free=1), View(free=2)]
    router.route(PROMPT, views, session="a")
    router.route(PROMPT, views, session="b")
    router.route(PROMPT, views, session="a")  # a is now the most recent
    router.route(PROMPT, views, session="c")
    assert router.session_replica("b") is None
    assert router.session_replica("a") == 1 and router.session_replica("c") == 1


def test_a_session_bound_to_a_replica_past_the_offered_list_is_routed_afresh():
    router = ReplicaRouter("prefix")
    assert router.route(PROMPT, [View(), View(), View(free=9)], session="s") == 2
    assert router.route(PROMPT, [View(), View(free=3)], session="s") == 1
    assert router.session_replica("s") == 1


# ---- bad input ----------------------------------------------------------------------------------
def test_an_unknown_policy_is_refused_naming_the_accepted_ones():
    with pytest.raises(ValueError, match="unknown router policy 'cache'; accepted: prefix, least-loaded, round-robin"):
        ReplicaRouter("cache")
    assert POLICIES == ("prefix", "least-loaded", "round-robin")


def test_routing_needs_replicas_and_a_prompt():
    with pytest.raises(ValueError, match="at least one replica"):
        ReplicaRouter().route(PROMPT, [])
    with pytest.raises(ValueError, match="at least one token"):
        ReplicaRouter().route([], [View()])
    with pytest.raises(ValueError, match="max_sessions must be >= 1"):
        ReplicaRouter(max_sessions=0)


# ---- replicas of real schedulers ---------------------------------------------------------------
def serve_rounds(policy: str, replicas: int, rounds: list[list[list[int]]]) -> list[list[int]]:
    """Each round's prompts routed over ``replicas`` real schedulers, run to the end; their cached tokens."""
    harnesses = [make_harness(budget=64, spec_overrides={"sliding_window": 16}) for _ in range(replicas)]
    views, router, out = [SchedulerView(h.sched) for h in harnesses], ReplicaRouter(policy), []
    for prompts in rounds:
        seqs = [harnesses[router.route(p, views)].add(p, max_tokens=2) for p in prompts]
        while any(h.sched.has_unfinished() for h in harnesses):
            for h in harnesses:
                if h.sched.has_unfinished():
                    h.step()
        out.append([s.num_cached_tokens for s in seqs])
    return out


def test_a_second_round_in_another_order_hits_on_two_replicas_as_on_one_and_round_robin_misses():
    prompts = [list(range(k * 100, k * 100 + 50)) for k in range(4)]
    rounds = [prompts, prompts[::-1]]
    single = serve_rounds("prefix", 1, rounds)
    assert single == [[0, 0, 0, 0], [48, 48, 48, 48]]
    assert serve_rounds("prefix", 2, rounds) == single
    assert serve_rounds("round-robin", 2, rounds) == [[0, 0, 0, 0], [0, 0, 0, 0]]


# ---- the prefix probe on a real block manager ---------------------------------------------------
def test_the_prefix_probe_counts_exactly_the_hit_the_next_admission_takes():
    h = make_harness(budget=64, full_retain=True, spec_overrides={"sliding_window": 16})  # blocks of 16
    h.add(range(50), max_tokens=2)
    h.run()
    probes = [(list(range(40)) + [999] * 20, 32), (list(range(17)), 16), (list(range(33)), 32),
              (list(range(50)), 48), (list(range(500, 560)), 0), ([3], 0)]
    for prompt, expected in probes:
        probed = h.bm.cached_prefix_tokens(prompt)
        seq = h.add(prompt, max_tokens=2)
        h.step()
        assert probed == seq.num_cached_tokens == expected, prompt[:3]
        h.run()


def test_the_prefix_probe_follows_admission_where_only_the_windows_at_prompt_ends_are_kept():
    h = make_harness(budget=64, spec_overrides={"sliding_window": 16})
    h.add(range(50), max_tokens=2)
    h.run()
    # blocks 0-1 of the shared run are cached compressed, but no window ends there: admission recomputes
    for prompt, expected in ((list(range(40)) + [999] * 20, 0), (list(range(50)), 48)):
        probed = h.bm.cached_prefix_tokens(prompt)
        seq = h.add(prompt, max_tokens=2)
        h.step()
        assert probed == seq.num_cached_tokens == expected
        h.run()


def test_the_prefix_probe_claims_nothing_and_keeps_the_eviction_order():
    h = make_harness(budget=64, full_retain=True, interval=32, spec_overrides={"sliding_window": 16})
    h.add(range(70), max_tokens=2)
    h.run()
    h.add(range(100, 170), max_tokens=2)
    h.run()
    bm = h.bm

    def state():  # references, the cache's LRU order (oldest first), the pins' order, index size
        return ([list(p.ref) for p in (bm.comp.pool, bm.swa.pool)], [list(p._cached) for p in (bm.comp.pool, bm.swa.pool)],
                list(bm.swa._pins), len(bm.index), bm.arena.num_free_chunks())
    before = state()
    assert bm.swa.num_pins > 0 and bm.comp.pool.num_cached() > 0
    assert bm.cached_prefix_tokens(list(range(70))) == 64
    assert bm.cached_prefix_tokens(list(range(100, 170))) == 64
    assert state() == before


def test_the_prefix_probe_is_zero_with_prefix_caching_off():
    h = make_harness(budget=64, prefix_caching=False, spec_overrides={"sliding_window": 16})
    h.add(range(50), max_tokens=2)
    h.run()
    assert h.bm.cached_prefix_tokens(list(range(50))) == 0


def test_the_scheduler_view_reports_the_probe_the_free_arena_and_the_waiting_tokens():
    h = make_harness(budget=64, spec_overrides={"sliding_window": 16})
    view = SchedulerView(h.sched)
    h.add(range(50), max_tokens=2)
    h.run()
    arena = h.bm.arena
    assert view.free_arena_bytes() == arena.num_free_chunks() * arena.layout.chunk_bytes
    assert view.free_arena_bytes() > 0
    assert view.cached_prefix_tokens(list(range(50))) == 48
    h.add(range(200, 230), max_tokens=2)
    h.add(range(300, 305), max_tokens=2)
    assert view.waiting_tokens() == h.sched.waiting_tokens() == 35
    assert view.running_tokens() == 0
    h.step()
    assert view.waiting_tokens() == 0
    assert view.running_tokens() == 35 + 2  # both prompts fit the 64-token step: each sampled its first token
