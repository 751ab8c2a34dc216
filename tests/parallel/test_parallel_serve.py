"""``atom serve --tensor-parallel-size 2`` on CPU: two gloo ranks serve the OpenAI API with the
greedy text of one rank, Ctrl-C stops every worker, and a worker that dies takes the server down
with a message naming it instead of leaving it hung in a collective. The same through ``torchrun``
(the multi-node path, here one node of 2 ranks)."""

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
from atom.parallel.process_group import free_port
from atom.sampling_params import SamplingParams

pytestmark = pytest.mark.slow

FLAGS = ["--max-model-len", "128", "--kv-cache-memory", "16MiB", "--max-num-seqs", "4"]
PROMPT = "The arena lends chunks"


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


def atom_command() -> list[str]:
    script = Path(sys.executable).parent / "atom"
    return [str(script)] if script.exists() else [sys.executable, "-m", "atom.entrypoints.cli"]


def start(tiny_dir, *extra: str) -> tuple[subprocess.Popen, str, int]:
    """A server process with 2 ranks: (process, URL, pid of the rank-1 worker)."""
    proc, url, seen = launch([*atom_command(), "serve", "--port", "0", "--tensor-parallel-size", "2", *FLAGS, *extra,
                              "--log-level", "warning"], tiny_dir)
    workers = [int(m.group(1)) for m in (re.search(r"rank 1 pid (\d+)", line) for line in seen) if m]
    assert workers, "".join(seen)
    return proc, url, workers[0]


def greedy_text(url: str) -> str:
    r = httpx.post(f"{url}/v1/completions", timeout=60,
                   json={"model": BUILTIN_MODEL_NAME, "prompt": PROMPT, "max_tokens": 8, "temperature": 0,
                         "ignore_eos": True})
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["text"]


@pytest.fixture(scope="module")
def single_rank_text(tiny_dir) -> str:
    one = build_engine(EngineConfig(ModelConfig(path=str(tiny_dir)), SchedulerConfig(max_num_seqs=4, max_model_len=128),
                                    CacheConfig(kv_cache_bytes=16 << 20)))
    return one.generate([PROMPT], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True),
                        use_tqdm=False)[0].text


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


def test_two_ranks_serve_the_single_rank_greedy_text_and_ctrl_c_stops_every_worker(tiny_dir, single_rank_text):
    proc, url, worker = start(tiny_dir)
    try:
        assert greedy_text(url) == single_rank_text
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    deadline = time.monotonic() + 10
    while alive(worker) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not alive(worker)


def test_torchrun_ranks_serve_the_single_rank_greedy_text_and_ctrl_c_stops_them_all(tiny_dir, single_rank_text):
    """The documented multi-node command on one node: torchrun starts both ranks of ``atom serve``."""
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--node-rank", "0",
                "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(free_port())]
    cmd = [*torchrun, "-m", "atom.entrypoints.cli", "serve", "--tensor-parallel-size", "2",
           "--distributed-executor-backend", "external_launcher", "--port", "0", *FLAGS]
    proc, url, _ = launch(cmd, tiny_dir, start_new_session=True)  # a terminal's Ctrl-C reaches its group
    ranks = children(proc.pid)
    try:
        assert len(ranks) == 2
        assert greedy_text(url) == single_rank_text
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    assert "atom: server stopped" in out
    deadline = time.monotonic() + 10
    while any(map(alive, ranks)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(map(alive, ranks))


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
