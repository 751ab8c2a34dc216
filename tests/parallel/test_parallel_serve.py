"""``atom serve --tensor-parallel-size 2`` on CPU: two gloo ranks serve the OpenAI API with the
greedy text of one rank, Ctrl-C stops every worker, and a worker that dies takes the server down
with a message naming it instead of leaving it hung in a collective."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from atom.builtin_model import BUILTIN_MODEL_NAME
from atom.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from atom.engine_builder import build_engine
from atom.sampling_params import SamplingParams

pytestmark = pytest.mark.slow

FLAGS = ["--max-model-len", "128", "--kv-cache-memory", "16MiB", "--max-num-seqs", "4"]
PROMPT = "The arena lends chunks"


def start(tiny_dir, *extra: str) -> tuple[subprocess.Popen, str, int]:
    """A server process with 2 ranks: (process, URL, pid of the rank-1 worker)."""
    script = Path(sys.executable).parent / "atom"
    cmd = [str(script)] if script.exists() else [sys.executable, "-m", "atom.entrypoints.cli"]
    env = {**os.environ, "ATOM_CACHE_DIR": str(tiny_dir.parent)}
    proc = subprocess.Popen([*cmd, "serve", "--port", "0", "--tensor-parallel-size", "2", *FLAGS, *extra,
                             "--log-level", "warning"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env=env)
    url = worker = None
    seen = []
    deadline = time.monotonic() + 120
    while url is None and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        m = re.search(r"rank 1 pid (\d+)", line)
        worker = int(m.group(1)) if m else worker
        if line.startswith("atom: serving at "):
            url = line.split()[3].removesuffix("/v1")
    if url is None or worker is None:
        proc.kill()
        pytest.fail("the server did not start:\n" + "".join(seen))
    return proc, url, worker


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_two_ranks_serve_the_single_rank_greedy_text_and_ctrl_c_stops_every_worker(tiny_dir):
    one = build_engine(EngineConfig(ModelConfig(path=str(tiny_dir)),
                                             SchedulerConfig(max_num_seqs=4, max_model_len=128),
                                             CacheConfig(kv_cache_bytes=16 << 20)))
    want = one.generate([PROMPT], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True), use_tqdm=False)
    proc, url, worker = start(tiny_dir)
    try:
        r = httpx.post(f"{url}/v1/completions", timeout=60,
                       json={"model": BUILTIN_MODEL_NAME, "prompt": PROMPT, "max_tokens": 8, "temperature": 0,
                             "ignore_eos": True})
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == want[0].text
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    deadline = time.monotonic() + 10
    while alive(worker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not alive(worker)


def test_a_worker_that_dies_takes_the_server_down_with_a_message_naming_it(tiny_dir):
    proc, url, worker = start(tiny_dir)
    os.kill(worker, signal.SIGKILL)
    try:
        out, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    assert proc.returncode == 1
    assert f"model worker rank 1 (pid {worker}) was killed by signal 9" in out
