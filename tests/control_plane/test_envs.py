"""The environment-variable registry: typed, documented, loud, and the only reader of os.environ."""

import ast
from pathlib import Path

import pytest

from atom import envs
from atom.config import CacheConfig

ROOT = Path(__file__).resolve().parents[2]


def test_defaults_apply_when_nothing_is_set():
    env = envs.load({})
    assert env == envs.AtomEnv()
    assert env.swa_full_retain is False and env.swa_retention_interval == 0


def test_full_retain_and_retention_interval_parse_from_the_environment():
    env = envs.load({"ATOM_SWA_FULL_RETAIN": "1", "ATOM_SWA_RETENTION_INTERVAL": "32768"})
    assert env.swa_full_retain is True
    assert env.swa_retention_interval == 32768


@pytest.mark.parametrize("name,value,fragment", [
    ("ATOM_SWA_FULL_RETAIN", "maybe", "is not a boolean"),
    ("ATOM_SWA_RETENTION_INTERVAL", "12.5", "is not an integer"),
    ("ATOM_SWA_RETENTION_INTERVAL", "-128", "is negative"),
    ("ATOM_SWA_PIN_FRACTION", "1.5", "out of range"),
    ("ATOM_KERNEL_BACKEND", "cuda", "accepted: auto, torch, triton, aiter"),
])
def test_a_bad_value_raises_naming_the_variable_and_what_is_accepted(name, value, fragment):
    with pytest.raises(envs.EnvError) as err:
        envs.load({name: value})
    assert name in str(err.value) and repr(value) in str(err.value) and fragment in str(err.value)


def test_an_unknown_atom_variable_warns_instead_of_being_silently_ignored():
    with pytest.warns(UserWarning, match="ATOM_SWA_FULL_RETIAN"):
        envs.load({"ATOM_SWA_FULL_RETIAN": "1"})


def test_every_registered_variable_has_a_doc_line_in_the_generated_table():
    table = envs.documentation()
    for name, var in envs.REGISTRY.items():
        assert var.doc.strip()
        assert f"`{name}`" in table


def test_cache_config_takes_the_retention_flags_from_the_parsed_environment():
    env = envs.load({"ATOM_SWA_FULL_RETAIN": "yes", "ATOM_SWA_RETENTION_INTERVAL": "256"})
    cfg = CacheConfig.from_env(env, kv_cache_bytes=1 << 20)
    assert (cfg.swa_full_retain, cfg.swa_retention_interval) == (True, 256)


def environment_reads(source: str) -> list[int]:
    """Line numbers of ``os.environ`` / ``os.getenv`` / ``from os import environ, getenv`` in code."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "putenv"):
            if isinstance(node.value, ast.Name) and node.value.id == "os":
                lines.append(node.lineno)
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            if any(a.name in ("environ", "getenv") for a in node.names):
                lines.append(node.lineno)
    return lines


def test_the_environment_read_detector_finds_each_form():
    src = "import os\nfrom os import getenv\na = os.environ['X']\nb = os.getenv('Y')\n# os.environ in a comment\n"
    assert sorted(environment_reads(src)) == [2, 3, 4]


def test_no_module_outside_envs_reads_the_environment():
    offenders = []
    for folder in ("atom", "kernels"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.name == "envs.py" and path.parent.name == "atom":
                continue
            offenders += [f"{path.relative_to(ROOT)}:{n}" for n in environment_reads(path.read_text())]
    assert offenders == []


def test_a_child_environment_keeps_the_process_environment_less_the_dropped_variables(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    monkeypatch.setenv("ATOM_TEST_CHILD_KEPT", "kept value")
    child = envs.child_environment(drop=("TRITON_INTERPRET",))
    assert "TRITON_INTERPRET" not in child
    assert child["ATOM_TEST_CHILD_KEPT"] == "kept value"
    assert envs.child_environment()["TRITON_INTERPRET"] == "1"
