"""Fixtures for the parallel tests: the built-in tiny checkpoint, written once per session."""

from __future__ import annotations

import pytest

from atom.builtin_model import ensure_builtin_model


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    return ensure_builtin_model(tmp_path_factory.mktemp("atom-cache"))
