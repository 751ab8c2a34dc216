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

import httpx
import pytest

from atom.builtin_model import BUILTIN_MODEL_NAME
from atom.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from atom.engine_builder import build_engine
from atom.parallel.process_group import free_port
from atom.sampling_params import SamplingParams
from support.serve_process import kill_worker_and_read_exit, alive, atom_command, children, launch

pytestmark = pytest.mark.slow

FLAGS = ["--max-model-len", "128", "--kv-cache-memory", "16MiB", "--max-num-seqs", "4"]
PROMPT = "The arena lends chunks"


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
    out = kill_worker_and_read_exit(proc, worker)
    assert f"model worker rank 1 (pid {worker}) was killed by signal 9" in out
