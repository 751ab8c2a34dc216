"""How the control-plane benchmark repeats its configurations and keeps the collector out of timings."""

import gc

from atom.bench.control_plane import _low_spread, _round_robin
from atom.bench.control_plane_ops import frozen_gc


def test_repetitions_run_round_robin_over_the_configurations():
    calls = []
    runs = [lambda name=name: calls.append(name) or len(calls) for name in "abc"]
    results = _round_robin(runs, reps=3)
    assert calls == list("abcabcabc")
    assert results == [[1, 4, 7], [2, 5, 8], [3, 6, 9]]


def test_a_figure_is_the_lowest_of_its_runs_and_the_spread_their_range_over_it():
    assert _low_spread([10.0, 12.0, 9.0, 30.0, 11.0]) == (9.0, 21.0 / 9.0)
    assert _low_spread([5.0]) == (5.0, 0.0)


def test_the_collector_is_frozen_only_inside_the_timed_body():
    before = gc.get_freeze_count()
    kept = [[i] for i in range(100)]  # alive while frozen: moved out of the collector's generations
    with frozen_gc():
        assert gc.get_freeze_count() >= before + len(kept)
    assert gc.get_freeze_count() == before
