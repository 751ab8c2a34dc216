"""Fixtures of the server tests: the built-in tiny model in a private cache, and real servers.

Every server's teardown runs ``check_integrity`` on its engine (see ``server_testlib``).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))  # for server_testlib

import pytest  # noqa: E402

from atom.builtin_model import ensure_builtin_model  # noqa: E402
from server_testlib import start_server  # noqa: E402


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory):
    return ensure_builtin_model(tmp_path_factory.mktemp("atom-cache"))


@pytest.fixture(scope="module")
def server(model_dir):
    srv = start_server(model_dir, max_body_bytes=64 * 1024)
    yield srv
    srv.stop()
