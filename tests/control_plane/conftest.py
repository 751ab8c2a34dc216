"""Fixtures for control-plane tests."""

import pytest

from support.control_plane import make_harness


@pytest.fixture
def harness():
    """The factory :func:`support.control_plane.make_harness` (keyword arguments set the sizes)."""
    return make_harness
