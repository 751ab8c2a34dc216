"""A request lives as long as its client: a multi-prompt request is admitted in one engine command, a
disconnect aborts every sequence it added (waiting or running) at once, and the shutdown deadline
ends each open stream with an error event and ``data: [DONE]`` instead of cutting it."""

import asyncio
import json
import logging
import socket
import threading
import time

import httpx
import pytest

from atom.builtin_model import BUILTIN_MODEL_NAME as MODEL
from atom.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from atom.entrypoints.args import ServerArgs
from atom.entrypoints.launch import Server, load_engine
from atom.entrypoints.limits import ServerLimits
from atom.entrypoints.metrics import ServerMetrics
from atom.entrypoints.openai_server import build_app
from atom.sampling_params import SamplingParams
from support.server import RunningServer, start_server

PROMPTS, PROMPT_LEN = 64, 2000


@pytest.fixture(scope="module")
def long_server(model_dir):
    """A server whose prompts may be 2,000 tokens long; 64 of them cannot all run at once."""
    config = EngineConfig(ModelConfig(path=str(model_dir), served_model_name=MODEL),
                          SchedulerConfig(max_model_len=2048, max_num_seqs=4, max_num_batched_tokens=64),
                          CacheConfig(kv_cache_bytes=64 << 20))
    engine = load_engine(config)
    limits = ServerLimits()
    metrics = ServerMetrics()
    server = Server(build_app(engine, limits=limits, metrics=metrics),
                    ServerArgs(port=0, log_level="warning", limits=limits), announce=False, metrics=metrics)
    thread = server.run_in_thread()  # sets server.url
    srv = RunningServer(server.url, engine, server, thread)
    yield srv
    srv.stop()


def _load(engine) -> tuple[int, int]:
    return engine.call_sync(lambda e: (e.stats().num_running, e.stats().num_waiting))


def _send_raw(url: str, path: str, body: dict) -> socket.socket:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    payload = json.dumps(body).encode()
    sock = socket.create_connection((host, int(port)), timeout=30)
    sock.sendall(f"POST {path} HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
                 f"content-length: {len(payload)}\r\n\r\n".encode() + payload)
    return sock


def _wait_until(predicate, timeout: float, step: float = 0.01) -> float:
    """Seconds until ``predicate()`` held (raises if it did not within ``timeout``)."""
    start = time.monotonic()
    while not predicate():
        assert time.monotonic() - start < timeout, "timed out"
        time.sleep(step)
    return time.monotonic() - start


@pytest.mark.parametrize("stream", [False, True])
def test_a_disconnect_aborts_every_waiting_and_running_prompt_within_a_second(long_server, stream):
    body = {"model": MODEL, "prompt": [[40 + (p % 50)] * PROMPT_LEN for p in range(PROMPTS)], "max_tokens": 40,
            "ignore_eos": True, "stream": stream}
    sock = _send_raw(long_server.url, "/v1/completions", body)
    try:
        # admission is one engine command: all 64 are in (4 running, the rest waiting) together
        _wait_until(lambda: sum(_load(long_server.engine)) > 0, timeout=30)
        running, waiting = _load(long_server.engine)
        assert running + waiting == PROMPTS and running >= 1
    finally:
        sock.close()
    assert _wait_until(lambda: _load(long_server.engine) == (0, 0), timeout=10) < 1.0
    long_server.engine.call_sync(lambda e: e.check_integrity())


def test_a_group_is_admitted_all_or_none(long_server):
    engine = long_server.engine

    async def run():
        group = engine.group()
        good = SamplingParams(max_tokens=4)
        with pytest.raises(ValueError):
            await group.add_all([("ok-0", [65] * 8, good), ("ok-1", [65] * 8, good), ("bad", [65] * 3000, good)])
        assert not group.unfinished

    asyncio.run(run())
    assert _load(engine) == (0, 0)


def test_the_shutdown_deadline_ends_each_open_stream_with_an_error_event_and_done(model_dir, caplog):
    # Streams long enough (4,000 tokens) that none can finish inside the 0.5 s deadline on a fast machine.
    srv = start_server(model_dir, limits=ServerLimits(shutdown_timeout=0.5), max_model_len=4096)
    for name in ("uvicorn", "uvicorn.error"):  # uvicorn's loggers do not propagate
        logging.getLogger(name).addHandler(caplog.handler)
    lines: list[list[str]] = [[], []]
    started = [threading.Event(), threading.Event()]

    def stream(i: int) -> None:
        body = {"model": MODEL, "prompt": f"long {i}", "max_tokens": 4000, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", f"{srv.url}/v1/completions", json=body, timeout=60) as r:
            for line in r.iter_lines():
                if line:
                    lines[i].append(line)
                    started[i].set()

    readers = [threading.Thread(target=stream, args=(i,)) for i in range(2)]
    try:
        for r in readers:
            r.start()
        assert all(e.wait(30) for e in started)
        srv.server.stop(srv.thread)
        for r in readers:
            r.join(30)
    finally:
        for name in ("uvicorn", "uvicorn.error"):
            logging.getLogger(name).removeHandler(caplog.handler)
    for got in lines:
        assert got[-1] == "data: [DONE]"
        error = json.loads(got[-2].removeprefix("data: "))["error"]
        assert error["code"] == "server_shutting_down" and "--shutdown-timeout" in error["message"]
        assert 1 <= len(got) - 2 < 4000  # cut before the end, after some tokens
    assert not [r for r in caplog.records if "Exception in ASGI application" in r.getMessage()]
    assert not [r for r in caplog.records if r.exc_info]
