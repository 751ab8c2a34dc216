"""Suite-wide settings.

Every test runs torch with one intra-op thread: the tiny models are launch-bound, and the suite runs two
pytest-xdist workers on two cores, where a second OpenMP thread per worker only spin-waits for a core (under
load, the host-tier counting test took 36 s of CPU with two threads and 2 s with one). torch is not imported
here: the setting applies once a test module has imported it.

Collection runs with the garbage collector off: importing the suite makes hundreds of thousands of objects
that live for the whole run and nothing to collect, and the collector kept walking them (collecting the
suite took 8.5 s of CPU, 2.8 s of it in the collector; 5.8 s with it off). What collection made then goes to
the oldest generation without a pass over it (``gc.freeze`` and ``gc.unfreeze``, as
``atom.models.deepseek_v4.loader.collection_paused`` does), so no object stays frozen: the loader's own
pause, and its test, need a process where nothing is.
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
        gc.freeze()  # then unfreeze: into the oldest generation unexamined, nothing left frozen
        gc.unfreeze()
        gc.enable()
