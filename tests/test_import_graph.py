"""The layers of the package stay one-directional: no two subpackages of ``atom`` import each other.

A subpackage is ``atom.<name>`` (a folder, or a top-level module); ``kernels/`` counts as
``atom.kernels``. Every import statement is read from the source, function-level ones included,
so a cycle cannot hide behind a lazy import.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _unit(path: Path) -> str:
    rel = path.relative_to(ROOT)
    if rel.parts[0] == "kernels":
        return "atom.kernels"
    parts = rel.with_suffix("").parts
    return ".".join(parts[:2])


def _edges() -> set[tuple[str, str]]:
    edges = set()
    files = list((ROOT / "atom").rglob("*.py")) + list((ROOT / "kernels").rglob("*.py"))
    for f in files:
        src = _unit(f)
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            else:
                continue
            for name in names:
                parts = name.split(".")
                if parts[0] == "atom" and len(parts) > 1 and ".".join(parts[:2]) != src:
                    edges.add((src, ".".join(parts[:2])))
    return edges


def test_the_import_graph_finds_the_known_layering():
    edges = _edges()
    assert ("atom.model_executor", "atom.model_engine") in edges  # the runner reads the batch contract
    assert ("atom.model_ops", "atom.kernels") in edges


def test_no_two_subpackages_import_each_other():
    edges = _edges()
    cycles = sorted(f"{a} <-> {b}" for a, b in edges if (b, a) in edges and a < b)
    assert cycles == []
