"""``atom serve`` as a child process: start it and read its output until it serves, find its workers."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest


def atom_command() -> list[str]:
    """The ``atom`` console script of this environment (or the module, when it is not installed)."""
    script = Path(sys.executable).parent / "atom"
    return [str(script)] if script.exists() else [sys.executable, "-m", "atom.entrypoints.cli"]


def launch(cmd: list[str], tiny_dir, **popen) -> tuple[subprocess.Popen, str, list[str]]:
    """Start ``cmd`` and read its output until it serves: (process, URL, the lines so far)."""
    env = {**os.environ, "ATOM_CACHE_DIR": str(tiny_dir.parent)}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, **popen)
    url = None
    seen = []
    deadline = time.monotonic() + 120
    while url is None and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        if line.startswith("atom: serving at "):
            url = line.split()[3].removesuffix("/v1")
    if url is None:
        proc.kill()
        pytest.fail("the server did not start:\n" + "".join(seen))
    return proc, url, seen


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from /proc)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def wait_gone(pids: list[int], timeout: float = 10.0) -> bool:
    """Whether every process of ``pids`` ended within ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while any(map(alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return not any(map(alive, pids))


def kill_worker_and_read_exit(proc: subprocess.Popen, worker: int, timeout: float = 60.0) -> str:
    """SIGKILL the model worker ``worker`` of the server ``proc``; the server's output once it has exited with
    status 1 (the watchdog's verdict), which the caller checks for the message naming the worker."""
    import signal

    os.kill(worker, signal.SIGKILL)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    assert proc.returncode == 1, out
    return out
