"""``docs/configuration.md`` is exactly what the parser and the environment registry generate."""

from __future__ import annotations

from pathlib import Path

from atom.entrypoints.config_doc import render
from atom.envs import REGISTRY

DOC = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"


def test_the_committed_configuration_page_equals_the_generated_one():
    assert DOC.read_text() == render(), "regenerate: python -m atom.entrypoints.config_doc > docs/configuration.md"


def test_the_page_names_every_environment_variable_and_the_kv_and_parallel_flags():
    page = render()
    assert all(f"`{name}`" in page for name in REGISTRY)
    for flag in ("--kv-cache-dtype", "--tensor-parallel-size", "--max-body-bytes", "--quant-sim"):
        assert f"`{flag}`" in page
