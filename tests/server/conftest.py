"""Fixtures of the server tests: the built-in tiny model in a private cache, and real servers.

Every server's teardown runs ``check_integrity`` on its engine (see ``support.server``).
"""

import pytest

from atom.builtin_model import ensure_builtin_model
from support.server import start_server


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    return ensure_builtin_model(tmp_path_factory.mktemp("atom-cache"))


@pytest.fixture(scope="module")
def server(model_dir):
    srv = start_server(model_dir, max_body_bytes=64 * 1024)
    yield srv
    srv.stop()
