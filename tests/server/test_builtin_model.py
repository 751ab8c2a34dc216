"""The built-in tiny model: written once, atomically, to the cache folder, then reused."""

import threading

import pytest

from atom import builtin_model
from atom.builtin_model import BUILTIN_DIR_NAME, ensure_builtin_model
from atom.tokenizer import Tokenizer


def test_the_first_call_writes_a_complete_model_and_reports_progress_on_stderr(tmp_path, capsys):
    path = ensure_builtin_model(tmp_path)
    assert path == tmp_path / BUILTIN_DIR_NAME
    names = {p.name for p in path.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= names
    assert "first run only" in capsys.readouterr().err
    assert Tokenizer.from_dir(path).eos_token_id == 257
    assert [p.name for p in tmp_path.iterdir()] == [BUILTIN_DIR_NAME]  # no temporary folder left


def test_a_second_call_reuses_the_folder_without_writing_or_printing(tmp_path, capsys, monkeypatch):
    path = ensure_builtin_model(tmp_path)
    capsys.readouterr()
    mtime = (path / "model.safetensors").stat().st_mtime_ns
    monkeypatch.setattr(builtin_model, "_write", lambda tmp: pytest.fail("rewrote a complete model"))
    assert ensure_builtin_model(tmp_path) == path
    assert (path / "model.safetensors").stat().st_mtime_ns == mtime
    assert capsys.readouterr().err == ""


def test_the_same_seed_gives_byte_identical_weights_in_two_caches(tmp_path):
    a = ensure_builtin_model(tmp_path / "a")
    b = ensure_builtin_model(tmp_path / "b")
    assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()


def test_an_incomplete_folder_is_replaced_by_a_complete_one(tmp_path):
    stale = tmp_path / BUILTIN_DIR_NAME
    stale.mkdir()
    (stale / "config.json").write_text("{}")  # e.g. a crashed copy by hand: no completion marker
    path = ensure_builtin_model(tmp_path)
    assert (path / "model.safetensors").is_file() and (path / "tokenizer.json").is_file()


def test_concurrent_first_runs_all_get_the_same_complete_folder(tmp_path):
    results, errors = [], []

    def run():
        try:
            results.append(ensure_builtin_model(tmp_path))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=run) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(set(results)) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [BUILTIN_DIR_NAME]


def test_the_cache_folder_comes_from_atom_cache_dir_when_no_argument_is_given(tmp_path, monkeypatch):
    monkeypatch.setenv("ATOM_CACHE_DIR", str(tmp_path / "envcache"))
    assert builtin_model.default_cache_dir() == tmp_path / "envcache"


def test_an_unwritable_cache_folder_is_a_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ValueError, match="ATOM_CACHE_DIR"):
        ensure_builtin_model(blocker / "sub")
