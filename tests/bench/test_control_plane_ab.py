"""The back-to-back control-plane timing of two trees: bad arguments refused, each tree's replay run
in its own process on that tree, and the figures and hit tokens of both reported."""

from pathlib import Path

import pytest

from atom.bench.control_plane_ab import _worker, main

ROOT = Path(__file__).resolve().parents[2]


def test_an_old_tree_without_the_side_by_side_replay_is_refused(tmp_path):
    (tmp_path / "atom").mkdir()
    with pytest.raises(SystemExit) as e:
        main(["--old", str(tmp_path)])
    assert str(e.value) == (f"--old {tmp_path}: give the root of a checkout of the project that has "
                            "atom/bench/control_plane_side.py")


@pytest.mark.parametrize("argv, message", [
    (["--traces", "chat"], "--traces 'chat': give one or more of decode-heavy, long-context, shared-prefix, comma-separated"),
    (["--traces", ","], "--traces ',': give one or more of decode-heavy, long-context, shared-prefix, comma-separated"),
    (["--block", "192"], "--block must be a positive multiple of 128; --decode-steps, --reps and --rounds >= 1"),
    (["--rounds", "0"], "--block must be a positive multiple of 128; --decode-steps, --reps and --rounds >= 1"),
])
def test_unknown_traces_a_block_off_128_or_no_rounds_are_refused(argv, message):
    with pytest.raises(SystemExit) as e:
        main(["--old", str(ROOT), *argv])
    assert str(e.value) == message


def test_a_worker_that_imported_atom_from_another_tree_refuses_to_time_it(tmp_path):
    with pytest.raises(SystemExit) as e:
        _worker(str(tmp_path), ["shared-prefix"], 128, 16, 1)
    assert str(e.value) == f"the worker imported atom from {ROOT}, not from the tree {tmp_path}"


def test_two_rounds_on_one_tree_report_every_figure_and_the_same_hits(capsys):
    main(["--old", str(ROOT), "--new", str(ROOT), "--traces", "shared-prefix", "--reps", "1", "--rounds", "2"])
    out = capsys.readouterr().out.splitlines()
    rows = [line.split(" | ") for line in out if line.startswith("| shared-prefix |")]
    assert [row[1] for row in rows] == ["admit", "decode", "free", "step"]
    for row in rows:  # two rounds of each tree, and a positive ratio
        assert len(row[2].split(" / ")) == 2 and len(row[3].split(" / ")) == 2
        assert float(row[4].rstrip(" |")) > 0
    # the shared 4K prefix (32 blocks) is hit by 63 of the 64 requests in both trees
    assert out[-1] == "hit tokens, shared-prefix: old 258048, new 258048 (same)"
