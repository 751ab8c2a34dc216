"""The reference model stays apart from the serving side: nothing in ``atom/models/deepseek_v4`` imports the
serving model, the arena ops or the runner (the serving model imports the reference's shared definitions,
never the other way round)."""

import ast
from pathlib import Path

import atom.models.deepseek_v4 as reference_package

SERVING_SIDE = ("atom.models.deepseek_v4_serving", "atom.model_ops", "atom.model_executor")


def imported_modules(path: Path) -> set[str]:
    """Every absolute module name ``path`` imports (``import a.b`` and ``from a.b import c``, at any depth)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def test_the_reference_model_imports_nothing_of_the_serving_model_the_arena_ops_or_the_runner():
    files = sorted(Path(reference_package.__file__).parent.glob("*.py"))
    assert len(files) > 10
    found = {f"{path.name}: {name}" for path in files for name in imported_modules(path)
             if name.startswith(SERVING_SIDE)}
    assert found == set()


def test_the_import_scan_sees_a_serving_import(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from atom.model_ops.kv_views import KvViews\n    import atom.model_executor.sampler\n")
    assert imported_modules(probe) == {"atom.model_ops.kv_views", "atom.model_executor.sampler"}
