"""Parametrization helpers that keep the fast loop (``-m "not slow"``) short without dropping cases."""

from __future__ import annotations

from collections.abc import Iterable

import pytest


def fast_subset(values: Iterable, fast: Iterable) -> list:
    """``values`` as pytest parameters, each one not in ``fast`` marked ``slow``.

    The fast loop runs the representative few in ``fast``; the whole suite still runs every value. Raises
    ``ValueError`` if ``fast`` names a value that is not in ``values`` (a typo would silently move a case)."""
    values, fast = list(values), list(fast)
    missing = [v for v in fast if v not in values]
    if missing:
        raise ValueError(f"fast values {missing} are not among the parameters {values}")
    return [v if v in fast else pytest.param(v, marks=pytest.mark.slow) for v in values]
