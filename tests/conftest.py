"""Suite-wide settings.

Every test runs torch with one intra-op thread: the tiny models are launch-bound, and the suite runs two
pytest-xdist workers on two cores, where a second OpenMP thread per worker only spin-waits for a core (under
load, the host-tier counting test took 36 s of CPU with two threads and 2 s with one). torch is not imported
here: the setting applies once a test module has imported it.

Collection runs with the garbage collector off, and every object alive after it (the imported modules of
torch, FastAPI, hypothesis and the tests themselves) is then moved out of the collector's generations
(``gc.freeze``): those objects live for the whole run, so each full collection would only walk them again.
Collecting the suite took 8.5 s of CPU, 2.8 s of it in the collector, and takes 5.8 s with it off. On the
fast kernel and bench tests, in two pairs of serial runs, the collector's time fell from 2.4 s and 2.3 s to
1.8 s and 1.9 s with the freeze, and the process's CPU from 29.8 s and 33.0 s to 27.0 s and 31.3 s.
"""

from __future__ import annotations

import gc
import sys

import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    torch = sys.modules.get("torch")
    if torch is not None and torch.get_num_threads() != 1:
        torch.set_num_threads(1)


@pytest.hookimpl(wrapper=True)
def pytest_collection(session: pytest.Session):
    gc.disable()
    try:
        return (yield)
    finally:
        gc.freeze()
        gc.enable()
