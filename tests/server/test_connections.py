"""Connection limits at a scaled-down cap: half-open connections are refused over the cap and closed by
the header timeout, open streams keep streaming, /health comes back, and the log stays quiet."""

import asyncio
import logging
import socket
import threading
import time

import httpx
import pytest

from atom.builtin_model import BUILTIN_MODEL_NAME as MODEL
from atom.entrypoints.connections import RateLimitedLoopErrors
from atom.entrypoints.limits import ServerLimits
from support.server import start_server

pytestmark = pytest.mark.slow

CAP, HEADER_TIMEOUT = 24, 3.0


@pytest.fixture(scope="module")
def capped(model_dir):
    srv = start_server(model_dir, limits=ServerLimits(max_connections=CAP, header_timeout=HEADER_TIMEOUT))
    yield srv
    srv.stop()


def _connect(url):
    host, port = url.removeprefix("http://").rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=10)
    return s


def _closed_within(sock, seconds):
    """What the server sent before closing, or None if it is still open after ``seconds``."""
    sock.settimeout(seconds)
    data = b""
    try:
        while True:
            chunk = sock.recv(4096)
            if not chunk:
                return data
            data += chunk
    except socket.timeout:
        return None
    except ConnectionResetError:
        return data


def test_half_open_connections_beyond_the_cap_are_refused_then_closed_and_streams_keep_going(capped, caplog):
    caplog.set_level(logging.INFO)
    for name in ("uvicorn", "uvicorn.error", "asyncio", "atom.server"):  # uvicorn's loggers do not propagate
        logging.getLogger(name).addHandler(caplog.handler)
    tokens, stream_error = [], []

    def stream():
        try:
            with httpx.stream("POST", f"{capped.url}/v1/completions", timeout=60,
                              json={"model": MODEL, "prompt": "keep streaming", "max_tokens": 40,
                                    "stream": True, "ignore_eos": True, "temperature": 0}) as r:
                for line in r.iter_lines():
                    if line.startswith("data: {"):
                        tokens.append(time.monotonic())
        except Exception as exc:  # reported below
            stream_error.append(exc)

    streamer = threading.Thread(target=stream)
    streamer.start()
    while not tokens and streamer.is_alive():
        time.sleep(0.05)
    start = time.monotonic()
    silent = [_connect(capped.url) for _ in range(3 * CAP)]
    time.sleep(0.5)
    answers = [_closed_within(s, 0.01) for s in silent]
    refused = [s for s, a in zip(silent, answers) if a is not None and a.startswith(b"HTTP/1.1 503")]
    held = [s for s, a in zip(silent, answers) if a is None]
    assert len(refused) >= 2 * CAP - 2 and len(refused) + len(held) == len(silent)  # beyond the cap: 503 at once
    assert all(_closed_within(s, HEADER_TIMEOUT + 3) == b"" for s in held)  # the header timeout closed them
    assert time.monotonic() - start < HEADER_TIMEOUT + 6
    assert httpx.get(f"{capped.url}/health", timeout=5).status_code == 200
    streamer.join(60)
    assert not stream_error and len(tokens) == 40  # one chunk per token, while the flood ran
    for name in ("uvicorn", "uvicorn.error", "asyncio", "atom.server"):
        logging.getLogger(name).removeHandler(caplog.handler)
    logged = [r for r in caplog.records if r.created >= start]
    assert len(logged) <= 5, [r.getMessage() for r in logged]
    for s in silent:
        s.close()


def test_a_client_dribbling_its_headers_is_closed_by_the_header_timeout(capped):
    s = _connect(capped.url)
    s.sendall(b"GET /health HTTP/1.1\r\n")
    start = time.monotonic()
    closed = False
    while time.monotonic() - start < HEADER_TIMEOUT + 3:
        try:
            s.sendall(b"X")
        except OSError:
            closed = True
            break
        if _closed_within(s, 0.2) is not None:
            closed = True
            break
    assert closed and time.monotonic() - start < HEADER_TIMEOUT + 2
    s.close()


def test_over_the_cap_refusals_are_counted_as_503(capped):
    before = capped.metrics().get('atom_request_errors_total{status="503"}', 0.0)
    socks = [_connect(capped.url) for _ in range(CAP + 3)]
    time.sleep(0.3)
    for s in socks:
        s.close()
    time.sleep(0.3)
    after = capped.metrics().get('atom_request_errors_total{status="503"}', 0.0)
    assert after - before >= 3


def test_the_loop_error_handler_logs_a_burst_then_one_summary_line(caplog):
    now = [0.0]
    handler = RateLimitedLoopErrors(burst=3, period=10.0, clock=lambda: now[0])
    loop = asyncio.new_event_loop()
    try:
        caplog.set_level(logging.ERROR)
        for _ in range(1000):
            handler(loop, {"message": "socket.accept() out of system resource"})
        assert len(caplog.records) == 3 and handler.suppressed == 997
        now[0] = 11.0
        handler(loop, {"message": "socket.accept() out of system resource"})
    finally:
        loop.close()
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 5 and "997 more event-loop errors" in messages[3]
