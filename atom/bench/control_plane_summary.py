"""How the control-plane benchmarks turn repeated runs into one figure.

A run of a benchmark configuration is a fixed sequence of calls (or steps), the same in every run
(same requests, same arena, same trace), each timed on its own, so the k-th sample of every run
measures the same work. Other processes on a shared machine only ever add time to a sample (they
take the CPU, its caches and execution units), so the lowest of a call's samples over the runs is
the nearest to the code's own cost, and each call needs only one undisturbed run. The figure is then
the centre (the median, or the mean for whole steps that differ in kind) over the calls of those
lowest samples: the cost of a typical call, not of the luckiest one.
"""

from __future__ import annotations

import math
import statistics
from typing import Callable, Sequence

__all__ = ["lowest_per_call"]


def lowest_per_call(runs: Sequence[Sequence[float]],
                    centre: Callable[[list[float]], float] = statistics.median) -> tuple[float, float]:
    """(figure, spread) of one operation or step from its runs' samples: one sequence per run, one
    sample per call in call order, every run the same calls.

    The figure: per call, the lowest sample over the runs, then ``centre`` over the calls. The
    spread: (max - min) / min over the runs of each run's own ``centre`` (what the runs disagreed
    by before the lowest was taken; 0 for one run). ``(nan, 0.0)`` when the calls never ran; a
    ValueError when the runs made different numbers of calls (they did not repeat the same work)."""
    if not runs or not runs[0]:
        return math.nan, 0.0
    if any(len(r) != len(runs[0]) for r in runs):
        raise ValueError(f"runs of one configuration made different numbers of calls: {[len(r) for r in runs]}")
    lowest = [min(samples) for samples in zip(*runs)]
    per_run = [centre(list(r)) for r in runs]
    low = min(per_run)
    return centre(lowest), (max(per_run) - low) / low if low > 0 else 0.0
