"""The one-call GPU check: bounded steps, logs kept, honest exit without a GPU."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from atom.bench import gpu_check
from atom.bench.gpu_check import STEPS, Step, junit_counts, run_steps


def _state(pid: int) -> str:
    """The process state letter of ``pid`` ('' when it is gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return ""


def test_without_a_gpu_it_exits_2_says_why_and_runs_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(gpu_check, "_gpu_name", lambda: None)
    out = tmp_path / "out"
    assert gpu_check.main(["--out", str(out)]) == 2
    assert "no CUDA or ROCm GPU" in capsys.readouterr().err
    assert not out.exists()


def test_steps_run_in_order_and_a_failure_an_overrun_and_a_spent_budget_are_reported(tmp_path):
    pid_file = tmp_path / "child.pid"
    sleeper = ("import subprocess, sys, time; p = subprocess.Popen(['sleep', '60']); "
               f"open({str(pid_file)!r}, 'w').write(str(p.pid)); print('started', flush=True); time.sleep(60)")
    steps = (Step("hello", (sys.executable, "-c", "print('hello from {out}')"), 0.1),
             Step("broken", (sys.executable, "-c", "import sys; sys.exit(3)"), 0.1),
             Step("stuck", (sys.executable, "-c", sleeper), 0.9),
             Step("late", (sys.executable, "-c", "print('never')"), 0.1))
    t0 = time.monotonic()
    results = run_steps(steps, tmp_path, budget_s=3.0, min_step_s=0.5)
    assert time.monotonic() - t0 < 6.0
    assert [(r.name, r.status.split(" after")[0]) for r in results] == [
        ("hello", "ok"), ("broken", "failed (exit 3)"), ("stuck", "timed out"), ("late", "not run: budget spent")]
    assert (tmp_path / "hello.log").read_text() == f"hello from {tmp_path}\n"
    assert (tmp_path / "stuck.log").read_text() == "started\n"  # what a killed step printed is kept
    assert not (tmp_path / "late.log").exists()
    child = int(pid_file.read_text())
    for _ in range(50):  # the grandchild went with the step's process group
        if _state(child) in ("", "Z"):
            break
        time.sleep(0.1)
    assert _state(child) in ("", "Z")


def test_junit_counts_read_passed_failed_and_skipped_from_a_pytest_report(tmp_path):
    (tmp_path / "test_three.py").write_text(
        "import pytest\n"
        "def test_passes():\n    assert True\n"
        "def test_fails():\n    assert False\n"
        "@pytest.mark.skip(reason='shown')\ndef test_skips():\n    pass\n")
    report = tmp_path / "report.xml"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path / "test_three.py"),
                    f"--junitxml={report}"], cwd=tmp_path, capture_output=True, check=False)
    assert junit_counts(report) == (1, 1, 1)
    assert junit_counts(tmp_path / "missing.xml") == (0, 0, 0)


def test_the_steps_cover_the_gpu_tests_and_every_gpu_benchmark_within_the_whole_budget():
    assert [s.name for s in STEPS] == ["tests", "kernels", "gemm", "speculative"]
    assert abs(sum(s.share for s in STEPS) - 1.0) < 1e-9
    tests = STEPS[0].argv
    assert tests[tests.index("-m", 2) + 1] == "gpu" and "tests/gpu" in tests
