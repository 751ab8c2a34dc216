"""Many clients at once, and clients that leave: every request completes or is aborted cleanly."""

import asyncio
import time

import httpx
import pytest

from atom.builtin_model import BUILTIN_MODEL_NAME as MODEL
from support.server import start_server

pytestmark = pytest.mark.slow


def test_32_concurrent_streaming_requests_all_complete_with_the_right_token_counts(server):
    import openai

    async def one(client, i):
        stream = await client.completions.create(
            model=MODEL, prompt=f"request number {i} ", max_tokens=8, stream=True, seed=i,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
        token_chunks, usage, reason = 0, None, None
        async for ch in stream:
            if ch.choices:
                token_chunks += 1
                reason = ch.choices[0].finish_reason or reason
            if ch.usage is not None:
                usage = ch.usage
        return token_chunks, usage, reason

    async def main():
        async with openai.AsyncOpenAI(base_url=server.base_url, api_key="x", max_retries=0, timeout=120) as client:
            return await asyncio.gather(*(one(client, i) for i in range(32)))

    results = asyncio.run(main())
    assert len(results) == 32
    for i, (token_chunks, usage, reason) in enumerate(results):
        assert reason == "length", i
        assert usage.completion_tokens == 8 and usage.prompt_tokens == len(f"request number {i} ") + 1
        assert token_chunks == 8  # one chunk per generated token
    m = server.metrics()
    assert m["atom_num_requests_running"] == 0 and m["atom_num_requests_waiting"] == 0


@pytest.fixture(scope="module")
def uncached_server(model_dir):
    """No prefix caching: once nothing runs, every arena byte is free again."""
    srv = start_server(model_dir, enable_prefix_caching=False)
    yield srv
    srv.stop()


def wait_until_idle(srv, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = srv.metrics()
        if m["atom_num_requests_running"] == 0 and m["atom_num_requests_waiting"] == 0:
            return m
        time.sleep(0.05)
    raise AssertionError(f"requests still in flight after {timeout} s: {m}")


def held_bytes(m):
    return m['atom_kv_arena_bytes{owner="swa"}'] + m['atom_kv_arena_bytes{owner="compress"}']


def test_a_client_that_disconnects_mid_stream_aborts_its_request_and_frees_its_memory(uncached_server):
    srv = uncached_server
    before = srv.metrics()
    assert held_bytes(before) == 0
    body = {"model": MODEL, "prompt": "x" * 40, "max_tokens": 200, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", f"{srv.base_url}/completions", json=body, timeout=60) as resp:
        lines = resp.iter_lines()
        assert next(lines).startswith("data: ")
        during = srv.metrics()
    assert during["atom_num_requests_running"] == 1 and held_bytes(during) > 0
    after = wait_until_idle(srv)
    assert held_bytes(after) == 0
    assert after['atom_kv_arena_bytes{owner="free"}'] == before['atom_kv_arena_bytes{owner="free"}']
    generated = after["atom_generation_tokens_total"] - before["atom_generation_tokens_total"]
    assert generated < 200  # it stopped early instead of running to max_tokens
    srv.engine.call_sync(lambda e: e.check_integrity())


def test_a_non_streaming_client_that_times_out_also_aborts_its_request(uncached_server):
    srv = uncached_server
    before = srv.metrics()
    body = {"model": MODEL, "prompt": "y" * 40, "max_tokens": 200, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{srv.base_url}/completions", json=body, timeout=httpx.Timeout(60, read=0.5))
    after = wait_until_idle(srv)
    assert held_bytes(after) == 0
    assert after["atom_generation_tokens_total"] - before["atom_generation_tokens_total"] < 200
    srv.engine.call_sync(lambda e: e.check_integrity())


def test_other_streams_finish_normally_while_one_client_disconnects(uncached_server):
    import openai

    srv = uncached_server

    async def leaver():
        async with httpx.AsyncClient(timeout=60) as c:
            body = {"model": MODEL, "prompt": "leave", "max_tokens": 200, "stream": True, "ignore_eos": True}
            async with c.stream("POST", f"{srv.base_url}/completions", json=body) as resp:
                async for _ in resp.aiter_lines():
                    return "left"

    async def stayer(client, i):
        r = await client.completions.create(model=MODEL, prompt=f"stay {i}", max_tokens=6,
                                            extra_body={"ignore_eos": True})
        return r.usage.completion_tokens

    async def main():
        async with openai.AsyncOpenAI(base_url=srv.base_url, api_key="x", max_retries=0, timeout=120) as client:
            return await asyncio.gather(leaver(), *(stayer(client, i) for i in range(4)))

    assert asyncio.run(main()) == ["left", 6, 6, 6, 6]
    assert held_bytes(wait_until_idle(srv)) == 0
