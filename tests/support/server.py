"""Helpers of the server tests: start a real server on a free loopback port.

A server here is the real thing: ``build_engine`` + the FastAPI app + uvicorn, listening
on a free loopback port in a thread of the test process (so tests can also reach the engine, e.g.
to run its integrity check). Every server's teardown runs ``check_integrity`` on its engine.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import httpx

from atom.builtin_model import BUILTIN_MODEL_NAME
from atom.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from atom.entrypoints.args import ServerArgs
from atom.entrypoints.launch import Server, load_engine
from atom.entrypoints.limits import ServerLimits
from atom.entrypoints.metrics import ServerMetrics
from atom.entrypoints.openai_server import build_app

SMALL_SCHEDULER = SchedulerConfig(max_model_len=256, max_num_seqs=16, max_num_batched_tokens=512)


def small_config(model_dir, enable_prefix_caching: bool = True, speculative_num_tokens: int = 0,
                 max_model_len: int | None = None) -> EngineConfig:
    """The small engine every server test serves (32 MiB of KV); ``max_model_len`` (and as many batched
    tokens) for tests whose prompts need more than the default 256 tokens."""
    scheduler = dataclasses.replace(SMALL_SCHEDULER, speculative_num_tokens=speculative_num_tokens)
    if max_model_len is not None:
        scheduler = dataclasses.replace(scheduler, max_model_len=max_model_len, max_num_batched_tokens=max_model_len)
    return EngineConfig(ModelConfig(path=str(model_dir), served_model_name=BUILTIN_MODEL_NAME), scheduler,
                        CacheConfig(kv_cache_bytes=32 << 20, enable_prefix_caching=enable_prefix_caching))


@dataclasses.dataclass
class RunningServer:
    url: str
    engine: Any  # AsyncEngine
    server: Server
    thread: Any

    @property
    def base_url(self) -> str:
        return f"{self.url}/v1"

    def client(self, **kw: Any):
        import openai

        return openai.OpenAI(base_url=self.base_url, api_key=kw.pop("api_key", "unused"), max_retries=0,
                             timeout=60, **kw)

    def metrics(self) -> dict[str, float]:
        """The /metrics samples as {'name{labels}': value}."""
        text = httpx.get(f"{self.url}/metrics", timeout=30).text
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                out[key] = float(value)
        return out

    def stop(self) -> None:
        try:
            self.engine.call_sync(lambda e: e.check_integrity())
        finally:
            self.server.stop(self.thread)


def start_server(model_dir, *, api_key: str | None = None, max_body_bytes: int | None = None,
                 limits: ServerLimits | None = None, enable_prefix_caching: bool = True,
                 speculative_num_tokens: int = 0, max_model_len: int | None = None) -> RunningServer:
    engine = load_engine(small_config(model_dir, enable_prefix_caching, speculative_num_tokens, max_model_len))
    if limits is None:
        limits = ServerLimits() if max_body_bytes is None else ServerLimits(max_body_bytes=max_body_bytes)
    metrics = ServerMetrics()
    server = Server(build_app(engine, api_key=api_key, limits=limits, metrics=metrics),
                    ServerArgs(port=0, log_level="warning", limits=limits), announce=False, metrics=metrics)
    thread = server.run_in_thread()
    return RunningServer(server.url, engine, server, thread)
