"""The OpenAI server over a data-parallel engine (two replicas with fake runners, the built-in tokenizer): the
choices of one request share a replica, a ``user`` stays on its replica, streaming and chat work, and
``/metrics`` shows each replica."""

from __future__ import annotations

import httpx
import pytest

from atom.builtin_model import BUILTIN_MODEL_NAME
from atom.config import CacheConfig, SchedulerConfig
from atom.entrypoints.args import ServerArgs
from atom.entrypoints.async_engine import AsyncEngine
from atom.entrypoints.launch import Server, describe_replicas
from atom.entrypoints.metrics import ServerMetrics
from atom.entrypoints.openai_server import build_app
from atom.kv.block_manager import BlockManager
from atom.kv.kv_layout import plan_kv_layout
from atom.model_engine.dp_engine import DataParallelEngine
from atom.model_engine.scheduler import Scheduler
from atom.models.deepseek_v4.loader import read_config
from atom.testing.fake_runner import FakeRunner
from atom.testing.replica_runners import ReplicaRunners
from atom.tokenizer import Tokenizer
from support.server import RunningServer


@pytest.fixture(scope="module")
def dp_server(model_dir):
    tokenizer = Tokenizer.from_dir(model_dir)
    limits = SchedulerConfig(max_model_len=256, max_num_seqs=8, max_num_batched_tokens=256)
    cache = CacheConfig(kv_cache_bytes=8 << 20)
    layout = plan_kv_layout(read_config(model_dir).kv_spec("fp32", include_mtp=False), cache, limits)
    schedulers = [Scheduler(limits, BlockManager(layout, cache), eos_token_id=tokenizer.eos_token_id) for _ in range(2)]
    runners = ReplicaRunners([FakeRunner(vocab_size=tokenizer.vocab_size, avoid=(tokenizer.eos_token_id,))
                              for _ in range(2)])
    engine = AsyncEngine(DataParallelEngine(schedulers, runners, tokenizer, model_name=BUILTIN_MODEL_NAME))
    metrics = ServerMetrics()
    server = Server(build_app(engine, metrics=metrics), ServerArgs(port=0, log_level="warning"), announce=False,
                    metrics=metrics)
    thread = server.run_in_thread()
    srv = RunningServer(server.url, engine, server, thread)
    yield srv
    srv.stop()


def replicas_of(srv, field: str = "prompt_tokens") -> list[int]:
    """Prompt tokens admitted so far on each replica (or another field of its ReplicaStats)."""
    return [getattr(r, field) for r in srv.engine.call_sync(lambda e: e.replica_stats())]


def complete(srv, **body) -> dict:
    r = httpx.post(f"{srv.url}/v1/completions", timeout=30,
                   json={"model": BUILTIN_MODEL_NAME, "max_tokens": 4, "temperature": 0, **body})
    assert r.status_code == 200, r.text
    return r.json()


def test_the_n_choices_of_a_request_run_on_one_replica_and_the_second_hits_the_first_ones_prefix(dp_server):
    before, hits = replicas_of(dp_server), replicas_of(dp_server, "hit_tokens")
    body = complete(dp_server, prompt="the arena lends chunks " * 3, n=2)
    grew = [a - b for a, b in zip(replicas_of(dp_server), before)]
    assert sorted(grew) == [0, 2 * body["usage"]["prompt_tokens"]] and len(body["choices"]) == 2
    d = grew.index(max(grew))
    assert replicas_of(dp_server, "hit_tokens")[d] > hits[d]  # the second choice reused the first one's blocks


def test_a_user_keeps_its_replica_while_other_requests_spread(dp_server):
    first = replicas_of(dp_server)
    complete(dp_server, prompt="alpha beta gamma delta", user="alice")
    after_alice = replicas_of(dp_server)
    alice = [d for d in range(2) if after_alice[d] != first[d]]
    for text in ("one two three", "four five six seven eight nine ten", "eleven twelve"):
        before = replicas_of(dp_server)
        complete(dp_server, prompt=text, user="alice")
        assert [d for d in range(2) if replicas_of(dp_server)[d] != before[d]] == alice


def test_streaming_and_chat_work_over_the_replicas(dp_server):
    with httpx.stream("POST", f"{dp_server.url}/v1/completions", timeout=30,
                      json={"model": BUILTIN_MODEL_NAME, "prompt": "streamed words", "max_tokens": 5,
                            "temperature": 0, "stream": True}) as r:
        events = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "data: [DONE]" and len(events) >= 3
    r = httpx.post(f"{dp_server.url}/v1/chat/completions", timeout=30,
                   json={"model": BUILTIN_MODEL_NAME, "messages": [{"role": "user", "content": "hi"}],
                         "max_tokens": 3, "temperature": 0})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3


def test_metrics_and_the_startup_lines_show_each_replica(dp_server):
    complete(dp_server, prompt="metrics please")
    m = dp_server.metrics()
    stats = dp_server.engine.call_sync(lambda e: e.stats())
    for d, r in enumerate(stats.replicas):
        assert m[f'atom_replica_prompt_tokens_total{{replica="{d}"}}'] == r.prompt_tokens
        assert m[f'atom_replica_prefix_cache_hits_total{{replica="{d}"}}'] == r.hit_tokens
        assert m[f'atom_replica_num_requests_running{{replica="{d}"}}'] == 0
        assert m[f'atom_replica_kv_arena_bytes{{owner="free",replica="{d}"}}'] == r.arena_bytes["free"]
    assert m["atom_prompt_tokens_total"] == sum(r.prompt_tokens for r in stats.replicas)
    assert m["atom_padding_steps_total"] == stats.padding_steps == sum(r.padding_steps for r in stats.replicas)
    lines = dp_server.engine.call_sync(lambda e: describe_replicas(e, 1))
    assert lines[1].startswith("  replica 0 (rank 0): arena ") and lines[2].startswith("  replica 1 (rank 1): arena ")
