"""Suite-wide settings.

Every test runs torch with one intra-op thread: the tiny models are launch-bound, and the suite runs two
pytest-xdist workers on two cores, where a second OpenMP thread per worker only spin-waits for a core (a
prefill's linears measured about 36 ms each that way under load, against microseconds alone). torch is not
imported here: the setting applies once a test module has imported it.
"""

from __future__ import annotations

import sys

import pytest


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    torch = sys.modules.get("torch")
    if torch is not None and torch.get_num_threads() != 1:
        torch.set_num_threads(1)
