"""The layers of the package stay one-directional, and each room imports only what docs/architecture.md
says it may.

A subpackage is ``atom.<name>`` (a folder, or a top-level module); ``kernels/`` counts as
``atom.kernels``. Every import statement is read from the source, function-level ones included,
so a cycle cannot hide behind a lazy import.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Set
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _unit(path: Path) -> str:
    rel = path.relative_to(ROOT)
    if rel.parts[0] == "kernels":
        return "atom.kernels"
    parts = rel.with_suffix("").parts
    return ".".join(parts[:2])


@functools.cache
def _edges() -> frozenset[tuple[str, str]]:
    """(importer, imported) subpackage pairs over every module: parsed once, since three tests read it."""
    edges = set()
    files = list((ROOT / "atom").rglob("*.py")) + list((ROOT / "kernels").rglob("*.py"))
    for f in files:
        src = _unit(f)
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == "atom":
                names = [f"atom.{a.name}" for a in node.names]  # ``from atom import envs``
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                parts = name.split(".")
                if parts[0] == "atom" and len(parts) > 1 and ".".join(parts[:2]) != src:
                    edges.add((src, ".".join(parts[:2])))
    return frozenset(edges)


def test_the_import_graph_finds_the_known_layering():
    edges = _edges()
    assert ("atom.model_executor", "atom.step_contract") in edges  # the runner reads the batch contract
    assert ("atom.model_engine", "atom.kv") in edges  # the scheduler drives the block manager
    assert ("atom.model_ops", "atom.kernels") in edges


def test_no_two_subpackages_import_each_other():
    edges = _edges()
    cycles = sorted(f"{a} <-> {b}" for a, b in edges if (b, a) in edges and a < b)
    assert cycles == []


# What each room may import of atom (docs/architecture.md, "Rooms"). A room not listed here is bound
# only by the no-cycle rule above.
ALLOWED = {
    # the KV memory: nothing of the step loop, the output side or speculative decoding
    "atom.kv": {"atom.config", "atom.kv_group", "atom.validation"},
    "atom.output": {"atom.kv", "atom.sampling_params", "atom.validation"},
    "atom.step_contract": {"atom.kv", "atom.output", "atom.sampling_params"},
    # speculative decoding: no step loop, no server, no runner; the drafter runs the model's layers
    "atom.spec_decode": {"atom.step_contract", "atom.kv", "atom.kv_group", "atom.sampling_params", "atom.config",
                         "atom.validation", "atom.models", "atom.model_ops", "atom.kernels"},
    # the step loop: pure Python, so no model, kernels, runner or server
    "atom.model_engine": {"atom.kv", "atom.output", "atom.spec_decode", "atom.step_contract", "atom.config",
                          "atom.kv_group", "atom.sampling_params", "atom.tokenizer", "atom.validation"},
    # the kernels: only the leaf modules, never an engine room
    "atom.kernels": {"atom.config", "atom.envs", "atom.kv_group", "atom.validation"},
}

#: Test oracles and stand-ins: only tests and benchmarks use them.
TESTING_USERS = {"atom.bench"}


def _broken_rules(edges: Set[tuple[str, str]]) -> list[str]:
    broken = {f"{a} -> {b}" for a, b in edges if a in ALLOWED and b not in ALLOWED[a]}
    broken |= {f"{a} -> {b}" for a, b in edges if b == "atom.testing" and a not in TESTING_USERS}
    return sorted(broken)


def test_every_room_imports_only_what_the_architecture_allows():
    assert _broken_rules(_edges()) == []


def test_a_forbidden_import_is_reported():
    edges = {("atom.kv", "atom.model_engine"), ("atom.spec_decode", "atom.entrypoints"),
             ("atom.model_engine", "atom.testing"), ("atom.model_engine", "atom.kv")}
    assert _broken_rules(edges) == ["atom.kv -> atom.model_engine", "atom.model_engine -> atom.testing",
                                    "atom.spec_decode -> atom.entrypoints"]


def _documented_imports() -> dict[str, set[str]]:
    """Room -> the ``atom.*`` names in the "may import" column of docs/architecture.md's rooms table."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    table = text.split("## Rooms", 1)[1].split("\n\n", 2)[1]
    rooms = {}
    for row in table.splitlines()[2:]:
        cells = [c.strip() for c in row.strip().strip("|").split("|")]
        path = re.match(r"`([^`]+)`", cells[0]).group(1)
        room = "atom.kernels" if path == "kernels/" else path.rstrip("/").removesuffix(".py").replace("/", ".")
        rooms[room] = set(re.findall(r"`(atom\.[a-z_.]+)`", cells[2]))
    return rooms


def test_the_architecture_page_lists_what_each_room_may_import():
    documented = _documented_imports()
    assert {room: documented.get(room) for room in ALLOWED} == ALLOWED
