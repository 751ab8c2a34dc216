"""Process-level behaviour: a busy ``--port`` fails before the model loads (exit 2), ``/health`` answers
while the connection cap is full, ``atom bench serve --output-json`` writes strict JSON, and every
stall-bench attack passes the default body limit so it reaches the checks behind it."""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from atom.builtin_model import BUILTIN_MODEL_NAME as MODEL
from atom.entrypoints.limits import ServerLimits
from support.server import start_server

CAP = 4


def _atom_command() -> list[str]:
    script = Path(sys.executable).parent / "atom"
    return [str(script)] if script.exists() else [sys.executable, "-m", "atom.entrypoints.cli"]


def test_a_busy_port_exits_2_before_the_model_loads(tmp_path):
    busy = socket.socket()
    busy.bind(("127.0.0.1", 0))
    busy.listen()
    port = busy.getsockname()[1]
    try:
        proc = subprocess.run([*_atom_command(), "serve", "--port", str(port)], capture_output=True, text=True,
                              timeout=120, env={**os.environ, "ATOM_CACHE_DIR": str(tmp_path)})
    finally:
        busy.close()
    assert proc.returncode == 2, proc.stderr
    assert f"127.0.0.1:{port}" in proc.stderr and "--port" in proc.stderr
    assert "loading" not in proc.stderr and not list(tmp_path.iterdir())  # nothing was loaded or written


@pytest.fixture(scope="module")
def capped(model_dir):
    srv = start_server(model_dir, limits=ServerLimits(max_connections=CAP, header_timeout=5.0))
    yield srv
    srv.stop()


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=10)


def test_health_answers_200_while_the_connection_cap_is_full_and_other_requests_get_503(capped):
    idle = [_connect(capped.url) for _ in range(CAP)]
    try:
        time.sleep(0.2)
        for _ in range(3):
            r = httpx.get(f"{capped.url}/health", timeout=5)
            assert r.status_code == 200 and r.json() == {"status": "ok"}
        refused = httpx.post(f"{capped.url}/v1/completions", json={"model": MODEL, "prompt": "x"}, timeout=5)
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "too_many_connections"
        silent = _connect(capped.url)  # over the cap and saying nothing: refused once its window is over
        silent.settimeout(5)
        assert silent.recv(4096).startswith(b"HTTP/1.1 503")
        silent.close()
    finally:
        for s in idle:
            s.close()


def test_bench_serve_output_json_is_strict_json_with_null_for_no_pacing(server, tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run([*_atom_command(), "bench", "serve", "--base-url", server.url, "--num-requests", "2",
                           "--concurrency", "2", "--prompt-len", "8", "--output-len", "2", "--api-key", "sekret",
                           "--output-json", str(out)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr

    def refuse(constant: str):
        raise AssertionError(f"{constant} is not JSON")

    report = json.loads(out.read_text(), parse_constant=refuse)
    assert report["config"]["request_rate"] is None and report["completed"] == 2
    assert report["config"]["api_key"] == "(set)"


def test_every_stall_attack_fits_the_default_body_limit_and_the_at_limit_ones_sit_at_the_prompt_limit():
    from atom.entrypoints.limits import PROMPT_CHARS_PER_TOKEN
    from atom.entrypoints.request_parse import PROMPT_FIELDS, prompt_chars_raw
    from atom.entrypoints.stall_bench import ATTACKS

    limits = ServerLimits().for_model(4096)
    assert limits.max_prompt_chars == PROMPT_CHARS_PER_TOKEN * 4096
    for name, make in ATTACKS.items():
        body = make(1.0, MODEL, limits.max_prompt_chars)
        assert len(json.dumps(body).encode()) <= limits.max_body_bytes, name
        kind = "chat" if "messages" in body else "completion"
        chars, _ = prompt_chars_raw(body, PROMPT_FIELDS[kind], 10**9)
        if name.endswith("at-limit"):
            assert chars == limits.max_prompt_chars, name
        elif name not in ("control-tiny-400", "stops-300k-n64", "token-ids-1M"):
            assert chars > limits.max_prompt_chars, name
