"""Every GPU check in one bounded run: ``python -m atom.bench.gpu_check --out DIR [--budget-s 450]``.

On a machine with a CUDA or ROCm GPU this runs, one after the other, each in its own process:

- ``tests``: the ``gpu``-marked tests (``pytest -m gpu tests/gpu``, compiled Triton, no interpreter),
  with a JUnit report whose counts the summary gives;
- ``kernels``: the KV and attention kernel benchmark (``python -m atom.kernels.bench_kernels``);
- ``gemm``: the quantized GEMM and fused-MoE benchmark (the same with ``--gemm``);
- ``speculative``: MTP and oracle drafts against plain decoding on the GPU
  (``python -m atom.bench.speculative --device cuda``).

Why one script: a GPU machine is lent for minutes at a time, and each start costs minutes, so every
check must run in one call that cannot overrun. Each step gets its own share of ``--budget-s``
(never more than what is left of it), is killed with its process group when its share runs out, and
writes its output to ``DIR/<step>.log`` as it goes (the JSON tables and the JUnit report land in
``DIR`` too), so what ran before a stop is kept. The last lines are a summary, one per step (``ok``,
``failed (exit N)``, ``timed out after S s`` or ``not run: budget spent``), then
``gpu_check steps_ok=<n>/<m> tests_passed=<n> tests_failed=<n> tests_skipped=<n>``.

Without a GPU it says so and exits with status 2, running nothing (no figure is made up). Exit status
0 when every step was ok, else 1.

On a bare machine that has PyTorch and Triton but not this package installed, run from the checkout:
``python3 -m pip install -q --no-deps --no-build-isolation -e . && python3 -m atom.bench.gpu_check --out OUT``.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path

from atom.envs import child_environment

__all__ = ["Step", "StepResult", "STEPS", "run_steps", "junit_counts", "main"]


@dataclass(frozen=True)
class Step:
    """One check: a name (its log is ``<name>.log``), its command (``{out}`` is the output folder),
    and the share of the whole budget it may use."""

    name: str
    argv: tuple[str, ...]
    share: float


@dataclass(frozen=True)
class StepResult:
    name: str
    status: str  # "ok", "failed (exit N)", "timed out after S s", "not run: budget spent"
    seconds: float

    @property
    def ok(self) -> bool:
        return self.status == "ok"


PY = sys.executable
STEPS = (
    Step("tests", (PY, "-m", "pytest", "-q", "-rs", "-m", "gpu", "tests/gpu", "-p", "no:cacheprovider",
                   "--junitxml={out}/gpu_tests.xml"), 0.55),
    Step("kernels", (PY, "-m", "atom.kernels.bench_kernels", "--json", "{out}/kernels.json"), 0.15),
    Step("gemm", (PY, "-m", "atom.kernels.bench_kernels", "--gemm", "--json", "{out}/gemm.json"), 0.15),
    Step("speculative", (PY, "-m", "atom.bench.speculative", "--device", "cuda"), 0.15),
)

_MIN_STEP_S = 5.0  # a step is not started with less than this left of the budget


def run_steps(steps: tuple[Step, ...], out: Path, budget_s: float, cwd: Path | None = None,
              env: dict[str, str] | None = None, min_step_s: float = _MIN_STEP_S) -> list[StepResult]:
    """Run ``steps`` in order, each for at most ``share * budget_s`` seconds and never past the end of
    the whole budget (a step is not started with less than ``min_step_s`` left); each one's output
    goes to ``out/<name>.log``. A step that overruns is killed with its process group (the test
    workers and compiler processes it started go too)."""
    out.mkdir(parents=True, exist_ok=True)
    end = time.monotonic() + budget_s
    results = []
    for step in steps:
        left = end - time.monotonic()
        if left < min_step_s:
            results.append(StepResult(step.name, "not run: budget spent", 0.0))
            print(f"gpu_check: {step.name}: not run, {max(left, 0.0):.0f} s of the budget left", flush=True)
            continue
        limit = min(step.share * budget_s, left)
        argv = [a.replace("{out}", str(out)) for a in step.argv]
        print(f"gpu_check: {step.name}: {' '.join(argv)} (at most {limit:.0f} s)", flush=True)
        results.append(_run_one(step.name, argv, limit, out / f"{step.name}.log", cwd, env))
        print(f"gpu_check: {step.name}: {results[-1].status} in {results[-1].seconds:.1f} s", flush=True)
    return results


def _run_one(name: str, argv: list[str], limit: float, log: Path, cwd: Path | None,
             env: dict[str, str] | None) -> StepResult:
    t0 = time.monotonic()
    with open(log, "wb") as f:
        proc = subprocess.Popen(argv, stdout=f, stderr=subprocess.STDOUT, cwd=cwd, env=env, start_new_session=True)
        try:
            rc = proc.wait(timeout=limit)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return StepResult(name, f"timed out after {limit:.0f} s", time.monotonic() - t0)
    return StepResult(name, "ok" if rc == 0 else f"failed (exit {rc})", time.monotonic() - t0)


def junit_counts(path: Path) -> tuple[int, int, int]:
    """(passed, failed, skipped) of a pytest JUnit report; errors count as failures. (0, 0, 0) when
    the report is missing (the tests did not get to write it)."""
    if not path.exists():
        return 0, 0, 0
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    tests = sum(int(s.get("tests", 0)) for s in suites)
    failed = sum(int(s.get("failures", 0)) + int(s.get("errors", 0)) for s in suites)
    skipped = sum(int(s.get("skipped", 0)) for s in suites)
    return tests - failed - skipped, failed, skipped


def _gpu_name() -> str | None:
    """The GPU's name, or None when torch sees none."""
    import torch

    return torch.cuda.get_device_name() if torch.cuda.is_available() else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m atom.bench.gpu_check", description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, type=Path, help="folder for the logs, JSON tables and JUnit report")
    ap.add_argument("--budget-s", type=float, default=450.0,
                    help="wall-clock seconds for all steps together (default 450: inside an 8-minute window)")
    args = ap.parse_args(argv)
    if args.budget_s < _MIN_STEP_S:
        ap.error(f"--budget-s must be at least {_MIN_STEP_S:.0f} seconds, got {args.budget_s}")
    name = _gpu_name()
    if name is None:
        print("gpu_check: no CUDA or ROCm GPU (torch.cuda.is_available() is False); nothing run", file=sys.stderr)
        return 2
    import torch
    import triton

    print(f"gpu_check: {name}; torch {torch.__version__}, triton {triton.__version__}, python {sys.version.split()[0]}",
          flush=True)
    env = child_environment(drop=("TRITON_INTERPRET",))  # compiled kernels, not the interpreter
    root = Path(__file__).resolve().parents[2]
    results = run_steps(STEPS, args.out.resolve(), args.budget_s, cwd=root, env=env)
    passed, failed, skipped = junit_counts(args.out / "gpu_tests.xml")
    for r in results:
        print(f"gpu_check: {r.name:12s} {r.status} ({r.seconds:.1f} s)")
    print(f"gpu_check steps_ok={sum(r.ok for r in results)}/{len(results)} tests_passed={passed} "
          f"tests_failed={failed} tests_skipped={skipped}", flush=True)
    return 0 if all(r.ok for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
