"""python -m atom.bench.overlap: one row per loop and request count, the phases it times."""

from atom.bench.overlap import main


def test_the_overlap_bench_prints_a_sequential_and_an_overlapped_row_with_their_phases(capsys):
    assert main(["--seqs", "3", "--prompt", "8", "--output", "4", "--reps", "1"]) == 0
    rows = [line.split(" | ") for line in capsys.readouterr().out.splitlines()[2:]]
    assert [(r[0], r[1]) for r in rows] == [("| 3", "sequential"), ("| 3", "overlapped")]
    assert float(rows[0][3]) == 0.0 and float(rows[1][3]) > 0.0  # nothing runs beside a sequential step
    assert "schedule_ahead" in rows[1][4] and "complete_ahead" in rows[1][4] and "schedule_ahead" not in rows[0][4]
