"""Runs of consecutive ids as lists, without making a new int object per id.

CPython keeps one object for each int in -5 .. 256 and allocates every other int anew:
``list(range(a, a + 64))`` took 0.75 us against 0.08 us for a 64-entry slice of an existing list, so
building runs of block, page or node ids from ``range`` cost about as much as a Python loop over
them.
:func:`id_run` slices one list of ints made once (grown by doubling as larger ids are asked for),
so a run of ``n`` ids costs a pointer copy each; the objects are shared, which is harmless as ints
are immutable. The list holds one int per id up to the largest asked for (a few tens of bytes each,
small beside what the pools keep per id).
"""

from __future__ import annotations

import threading

__all__ = ["id_run"]

_INTS: list[int] = list(range(1 << 12))
_GROWING = threading.Lock()  # (engines on threads: two growths at once would append a stretch twice)


def id_run(start: int, stop: int) -> list[int]:
    """``list(range(start, stop))`` for ``0 <= start <= stop``, built from shared int objects."""
    if stop > len(_INTS):
        with _GROWING:
            if stop > len(_INTS):
                _INTS.extend(range(len(_INTS), max(stop, 2 * len(_INTS))))
    return _INTS[start:stop]
