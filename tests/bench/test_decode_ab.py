"""The back-to-back decode timing's driver: bad arguments are refused with what is accepted."""

import pytest

from atom.bench.decode_ab import main


def test_an_old_tree_without_an_atom_package_is_refused(tmp_path):
    with pytest.raises(SystemExit) as e:
        main(["--old", str(tmp_path)])
    assert str(e.value) == f"--old {tmp_path}: give the root of another checkout (a directory holding atom/)"


@pytest.mark.parametrize("argv", [["--batches", "0"], ["--rounds", "0"], ["--context", "1"], ["--batches", ","]])
def test_non_positive_batches_rounds_or_a_one_token_context_are_refused(argv, tmp_path):
    with pytest.raises(SystemExit) as e:
        main(["--old", str(tmp_path), *argv])
    assert str(e.value) == "--batches must be positive integers, --rounds and --threads >= 1, --context >= 2"
