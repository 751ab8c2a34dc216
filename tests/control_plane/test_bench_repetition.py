"""How the control-plane benchmark repeats its configurations, summarises their runs and keeps the
collector out of timings."""

import functools
import gc
import math
import os
import statistics
import weakref

import pytest

from atom.bench.control_plane import _fresh_rounds, _round_robin
from atom.bench.control_plane_summary import lowest_per_call
from atom.bench.control_plane_ops import frozen_gc


def test_repetitions_run_round_robin_over_the_configurations():
    calls = []
    runs = [lambda name=name: calls.append(name) or len(calls) for name in "abc"]
    results = _round_robin(runs, reps=3)
    assert calls == list("abcabcabc")
    assert results == [[1, 4, 7], [2, 5, 8], [3, 6, 9]]


def test_each_round_runs_in_a_fresh_process_and_results_come_back_per_configuration():
    round_fn = functools.partial(_round_robin, [os.getpid, os.getppid], 1)  # a round of two configurations
    pids, parents = _fresh_rounds(round_fn, reps=2)
    assert len(pids) == 2 and len({p[0] for p in pids}) == 2  # two processes
    assert os.getpid() not in {p[0] for p in pids}
    assert parents == [[os.getpid()], [os.getpid()]]


def test_a_figure_is_the_median_over_calls_of_each_calls_lowest_run():
    runs = [[10.0, 50.0, 20.0],  # run medians 20, 30, 12: spread (30 - 12) / 12
            [30.0, 11.0, 40.0],
            [12.0, 12.0, 9.0]]
    # lowest per call: 10, 11, 9 -> median 10 (no run's own median is that low)
    assert lowest_per_call(runs) == (10.0, 18.0 / 12.0)


def test_whole_steps_take_the_mean_over_steps_of_each_steps_lowest_run():
    runs = [[12.0, 78.0, 60.0], [30.0, 60.0, 30.0]]  # run means 50, 40: spread (50 - 40) / 40
    # lowest per step: 12, 60, 30 -> mean 34 (their median would be 30)
    assert lowest_per_call(runs, centre=statistics.mean) == (34.0, 0.25)


def test_one_run_gives_its_median_call_and_no_spread():
    assert lowest_per_call([[5.0, 1.0, 3.0]]) == (3.0, 0.0)


def test_an_operation_that_never_ran_is_nan_with_no_spread():
    fig, spread = lowest_per_call([[], []])
    assert math.isnan(fig) and spread == 0.0


def test_runs_with_different_call_counts_are_refused():
    with pytest.raises(ValueError, match=r"different numbers of calls: \[2, 3\]"):
        lowest_per_call([[1.0, 2.0], [1.0, 2.0, 3.0]])


def test_the_collector_is_frozen_and_off_only_inside_the_timed_body():
    gc.unfreeze()  # nothing frozen before the body (tests leave nothing frozen: see tests/conftest.py)
    kept = [[i] for i in range(100)]  # alive while frozen: moved out of the collector's generations
    assert gc.isenabled()
    with frozen_gc():
        assert gc.get_freeze_count() >= len(kept)
        assert not gc.isenabled()
    assert gc.get_freeze_count() == 0
    assert gc.isenabled()


class _Cycle:
    pass


def test_the_body_starts_without_a_collection_so_earlier_garbage_stays_frozen_until_it_ends():
    gc.unfreeze()
    garbage = _Cycle()
    garbage.me = garbage  # a reference cycle: only a collection frees it
    alive = weakref.ref(garbage)
    del garbage
    with frozen_gc():
        assert alive() is not None  # a full collection right before the body would have freed it
    gc.collect()
    assert alive() is None


def test_objects_frozen_before_the_body_stay_frozen_after_it():
    kept = [[i] for i in range(100)]
    gc.freeze()
    try:
        before = gc.get_freeze_count()
        with frozen_gc():
            pass
        assert gc.get_freeze_count() >= before >= len(kept)
    finally:
        gc.unfreeze()  # a frozen object left behind would fail the loader's collection-pause test


def test_the_collector_stays_off_after_the_body_when_it_was_off_before():
    gc.disable()
    try:
        with frozen_gc():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
