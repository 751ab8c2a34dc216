"""Suite-wide settings.

Every test runs torch with one intra-op thread: the tiny models are launch-bound, and the suite runs two
pytest-xdist workers on two cores, where a second OpenMP thread per worker only spin-waits for a core (under
load, the host-tier counting test took 36 s of CPU with two threads and 2 s with one). torch is not imported
here: the setting applies once a test module has imported it.
"""

from __future__ import annotations

import sys

import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    torch = sys.modules.get("torch")
    if torch is not None and torch.get_num_threads() != 1:
        torch.set_num_threads(1)
