"""``atom serve --data-parallel-size 2`` on CPU: two attention replicas (one gloo rank each, the experts split
over both) serve the OpenAI API with the greedy text of one rank (completions, chat, streaming, ``n = 2``),
a client that disconnects frees its request, the start-up log names each replica, Ctrl-C stops the
worker, and a worker that dies takes the server down with a message naming it."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time

import httpx
import pytest

from atom.builtin_model import BUILTIN_MODEL_NAME
from atom.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from atom.engine_builder import build_engine
from atom.sampling_params import SamplingParams
from support.serve_process import kill_worker_and_read_exit, atom_command, launch, wait_gone

pytestmark = pytest.mark.slow

FLAGS = ["--max-model-len", "128", "--kv-cache-memory", "16MiB", "--max-num-seqs", "4"]
PROMPT = "The arena lends chunks"
CHAT = [{"role": "user", "content": "Which replica holds my prefix?"}]


def start(tiny_dir) -> tuple[subprocess.Popen, str, int, list[str]]:
    """A server of 2 replicas: (process, URL, pid of the rank-1 worker, start-up lines)."""
    proc, url, seen = launch([*atom_command(), "serve", "--port", "0", "--data-parallel-size", "2", *FLAGS,
                              "--log-level", "warning"], tiny_dir)
    workers = [int(m.group(1)) for m in (re.search(r"rank 1 pid (\d+)", line) for line in seen) if m]
    assert workers, "".join(seen)
    return proc, url, workers[0], seen


@pytest.fixture(scope="module")
def single_rank(tiny_dir) -> tuple[str, str]:
    """The greedy completion text and chat answer of one rank."""
    engine = build_engine(EngineConfig(ModelConfig(path=str(tiny_dir), served_model_name=BUILTIN_MODEL_NAME),
                                       SchedulerConfig(max_num_seqs=4, max_model_len=128),
                                       CacheConfig(kv_cache_bytes=16 << 20)))
    text = engine.generate([PROMPT], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True),
                           use_tqdm=False)[0].text
    from atom.entrypoints.async_engine import AsyncEngine
    from atom.entrypoints.openai_server import build_app
    from fastapi.testclient import TestClient

    with TestClient(build_app(AsyncEngine(engine))) as client:
        chat = client.post("/v1/chat/completions", json=chat_body()).json()["choices"][0]["message"]
    return text, chat


def chat_body(**extra) -> dict:
    return {"model": BUILTIN_MODEL_NAME, "messages": CHAT, "max_tokens": 6, "temperature": 0, **extra}


def completion(url: str, **extra) -> httpx.Response:
    return httpx.post(f"{url}/v1/completions", timeout=60,
                      json={"model": BUILTIN_MODEL_NAME, "prompt": PROMPT, "max_tokens": 8, "temperature": 0,
                            "ignore_eos": True, **extra})


def metric(url: str, name: str) -> float:
    for line in httpx.get(f"{url}/metrics", timeout=30).text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{name} is not in /metrics")


def test_two_replicas_serve_the_single_rank_text_in_every_form_and_ctrl_c_stops_the_worker(tiny_dir, single_rank):
    text, chat = single_rank
    proc, url, worker, seen = start(tiny_dir)
    try:
        assert any("atom: 2 attention replicas" in line for line in seen), "".join(seen)
        assert any(line.startswith("atom:   replica 1 (rank 1): arena ") for line in seen), "".join(seen)
        r = completion(url)
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == text
        r = completion(url, n=2)
        assert [c["text"] for c in r.json()["choices"]] == [text, text]
        with httpx.stream("POST", f"{url}/v1/completions", timeout=60,
                          json={"model": BUILTIN_MODEL_NAME, "prompt": PROMPT, "max_tokens": 8, "temperature": 0,
                                "ignore_eos": True, "stream": True}) as s:
            events = [line[6:] for line in s.iter_lines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        assert "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1]) == text
        r = httpx.post(f"{url}/v1/chat/completions", timeout=60, json=chat_body())
        assert r.status_code == 200 and r.json()["choices"][0]["message"] == chat
        assert metric(url, 'atom_replica_num_requests_running{replica="0"}') == 0
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert wait_gone([worker])


def test_a_client_that_disconnects_frees_its_request_on_its_replica(tiny_dir):
    proc, url, worker, _ = start(tiny_dir)
    try:
        before = metric(url, "atom_generation_tokens_total")
        with httpx.stream("POST", f"{url}/v1/completions", timeout=60,
                          json={"model": BUILTIN_MODEL_NAME, "prompt": PROMPT, "max_tokens": 100, "temperature": 0,
                                "ignore_eos": True, "stream": True}) as s:
            for line in s.iter_lines():
                if line.startswith("data: "):
                    break  # the first token arrived: leave
        deadline = time.monotonic() + 20
        while metric(url, "atom_num_requests_running") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert metric(url, "atom_num_requests_running") == 0 and metric(url, "atom_num_requests_waiting") == 0
        generated = metric(url, "atom_generation_tokens_total") - before
        assert 1 <= generated < 100
        time.sleep(0.5)
        assert metric(url, "atom_generation_tokens_total") - before == generated  # it stays stopped
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out


def test_a_worker_that_dies_takes_the_data_parallel_server_down_with_a_message_naming_it(tiny_dir):
    proc, url, worker, _ = start(tiny_dir)
    out = kill_worker_and_read_exit(proc, worker)
    assert f"model worker rank 1 (pid {worker}) was killed by signal 9" in out
