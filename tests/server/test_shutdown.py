"""`atom serve` as a process: the key from ATOM_API_KEY, and SIGTERM drains the streams in flight and exits 0."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from atom.builtin_model import BUILTIN_MODEL_NAME

pytestmark = pytest.mark.slow


def _atom_command() -> list[str]:
    script = Path(sys.executable).parent / "atom"
    return [str(script)] if script.exists() else [sys.executable, "-m", "atom.entrypoints.cli"]


def _wait_for_url(proc, timeout=90):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        if line.startswith("atom: serving at "):
            return line.split()[3].removesuffix("/v1")
    raise AssertionError(f"no URL announced; stderr: {proc.stderr.read() if proc.poll() is not None else ''}")


def test_sigterm_lets_a_stream_in_flight_finish_then_exits_0_and_the_key_comes_from_the_environment(model_dir):
    env = {**os.environ, "ATOM_CACHE_DIR": str(model_dir.parent), "ATOM_API_KEY": "from-env"}
    proc = subprocess.Popen([*_atom_command(), "serve", "--port", "0", "--max-model-len", "128",
                             "--kv-cache-memory", "16MiB", "--max-num-seqs", "4", "--log-level", "warning",
                             "--shutdown-timeout", "60"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    chunks, started = [], threading.Event()
    try:
        url = _wait_for_url(proc)
        assert "from-env" not in " ".join(proc.args)
        body = {"model": BUILTIN_MODEL_NAME, "prompt": "drain me", "max_tokens": 48, "stream": True,
                "ignore_eos": True}
        assert httpx.post(f"{url}/v1/completions", json=body, timeout=30).status_code == 401

        def stream():
            with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120,
                              headers={"Authorization": "bearer from-env"}) as r:
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        chunks.append(json.loads(line[6:]))
                        started.set()

        reader = threading.Thread(target=stream)
        reader.start()
        assert started.wait(60)
        proc.send_signal(signal.SIGTERM)
        reader.join(120)
        proc.wait(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    stderr = proc.stderr.read()
    assert proc.returncode == 0, stderr
    assert "atom: server stopped" in stderr
    assert "atom: KV cache fp32 rows (" in stderr and " SWA tokens or " in stderr  # the start-up line: format, capacity
    assert len(chunks) == 48 and chunks[-1]["choices"][0]["finish_reason"] == "length"
