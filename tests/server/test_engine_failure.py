"""When the engine itself fails, requests get an error (not a hang) and the server says it is unhealthy."""

import httpx
import pytest

from atom.builtin_model import BUILTIN_MODEL_NAME as MODEL
from support.server import start_server

pytestmark = pytest.mark.slow


def test_a_failing_engine_step_fails_requests_in_flight_and_marks_the_server_unhealthy(model_dir):
    srv = start_server(model_dir)
    try:
        def broken_step():
            raise RuntimeError("simulated device fault")

        srv.engine.engine.step = broken_step  # fault injection on this instance only
        body = {"model": MODEL, "prompt": "x", "max_tokens": 4}
        r = httpx.post(f"{srv.base_url}/completions", json=body, timeout=30)
        assert r.status_code == 500 and r.json()["error"]["code"] == "engine_dead"
        health = httpx.get(f"{srv.url}/health", timeout=30)
        assert health.status_code == 503 and health.json()["error"]["code"] == "engine_dead"
        assert srv.metrics()["atom_engine_healthy"] == 0.0
        again = httpx.post(f"{srv.base_url}/completions", json={**body, "stream": True}, timeout=30)
        assert again.status_code == 503 and again.json()["error"]["type"] == "server_error"
    finally:
        srv.server.stop(srv.thread)
