"""The README's "What is here" table and docs/architecture.md name paths that exist, and the
architecture page covers every room and top-level module of the package."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _table(text: str, heading: str) -> list[list[str]]:
    """The cells of the first markdown table after ``heading`` (header and rule rows dropped)."""
    after = text.split(heading, 1)[1]
    rows = re.search(r"\n(\|.*\|\n)+", after).group(0).strip().splitlines()
    return [[c.strip() for c in row.strip().strip("|").split("|")] for row in rows[2:]]


def _first_path(cell: str) -> str:
    return re.match(r"`([^`]+)`", cell).group(1)


def _readme_paths() -> list[str]:
    rows = _table((ROOT / "README.md").read_text(), "## What is here")
    paths = [_first_path(cells[0]) for cells in rows]
    docs_row = next(cells for cells in rows if _first_path(cells[0]) == "docs/")
    paths += ["docs/" + name for name in re.findall(r"`([\w.]+\.md)`", docs_row[1])]
    return paths


def _architecture_paths() -> list[str]:
    """The rooms' paths, the files each room's row names inside it, and every backticked repo path."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    paths = []
    for cells in _table(text, "## Rooms"):
        room = _first_path(cells[0])
        paths.append(room)
        paths += [room + name for name in re.findall(r"`([\w]+\.py)`", cells[1]) if room.endswith("/")]
    paths += re.findall(r"`((?:atom|kernels|docs|tests)/[\w/.]*)`", text)
    return paths


def test_every_path_in_the_readme_table_exists():
    paths = _readme_paths()
    assert len(paths) > 20
    assert [p for p in paths if not (ROOT / p).exists()] == []


def test_every_path_on_the_architecture_page_exists():
    paths = _architecture_paths()
    assert "atom/kv/" in paths and "atom/kv/block_manager.py" in paths
    assert [p for p in paths if not (ROOT / p).exists()] == []


def test_the_architecture_page_has_a_row_for_every_room_and_names_every_top_level_module():
    text = (ROOT / "docs" / "architecture.md").read_text()
    rooms = {_first_path(cells[0]) for cells in _table(text, "## Rooms")}
    packages = {f"atom/{p.parent.name}/" for p in (ROOT / "atom").glob("*/__init__.py")} | {"kernels/"}
    modules = {f"atom/{p.name}" for p in (ROOT / "atom").glob("*.py") if p.name != "__init__.py"}
    assert packages - rooms == {"atom/configs/"}  # data (the released configs), named in the text
    assert {m for m in modules | {"atom/configs/"} if f"`{m}`" not in text} == set()


def test_the_readme_table_lists_every_room():
    listed = set(_readme_paths())
    packages = {f"atom/{p.parent.name}/" for p in (ROOT / "atom").glob("*/__init__.py")} | {"kernels/"}
    # a room is listed by its own path or by paths inside it (atom/models/deepseek_v4/); atom/configs/ is data
    assert {p for p in packages if not any(path.startswith(p) for path in listed)} == {"atom/configs/"}
