"""Packaging and the README: every package is installed, and CI runs the README's test command."""

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_folder_is_listed_in_pyproject():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "atom").rglob("__init__.py")}
    found.add("atom.kernels")
    assert found - listed == set()


def test_the_readme_starts_with_exactly_two_commands_and_ci_runs_the_test_one():
    readme = (ROOT / "README.md").read_text()
    commands = re.findall(r"```bash\n(.+?)\n```", readme, flags=re.S)
    assert len(commands) == 2
    run_cmd, test_cmd = commands
    assert "pip install torch==2.13.0" in run_cmd and "pytest" in test_cmd
    ci = (ROOT / ".ci" / "run").read_text()
    test_tail = test_cmd.split("&& ")[-1]
    assert test_tail in ci
    for step in test_cmd.split(" && ")[2:-1]:
        assert step.replace("pip install", "pip install -q") in ci or step in ci
