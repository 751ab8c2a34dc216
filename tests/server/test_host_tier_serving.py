"""``atom serve --host-kv-cache-memory 1`` on the built-in model: a long prompt, other prompts that evict it
from a small arena, the prompt again: its cached tokens come from the host tier and the answer is the
first one."""

import pytest

from atom.entrypoints import cli
from atom.builtin_model import BUILTIN_MODEL_NAME
from atom.entrypoints.args import ServerArgs, engine_config_from_args
from atom.entrypoints.launch import Server, load_engine
from atom.entrypoints.limits import ServerLimits
from atom.entrypoints.metrics import ServerMetrics
from atom.entrypoints.openai_server import build_app
from support.server import RunningServer

PROMPT = "".join(f"line {i}: the host tier keeps evicted prefix blocks. " for i in range(8))
GREEDY = dict(max_tokens=8, temperature=0)


def test_the_flag_takes_gib_or_a_size_and_refuses_a_negative_amount(capsys):
    def host_bytes(*flag):
        return engine_config_from_args(cli.build_parser().parse_args(["serve", *flag])).cache.host_kv_cache_bytes
    assert host_bytes() == 0
    assert host_bytes("--host-kv-cache-memory", "1") == 1 << 30
    assert host_bytes("--host-kv-cache-memory", "0.5") == 1 << 29
    assert host_bytes("--host-kv-cache-memory", "512MiB") == 512 << 20
    with pytest.raises(SystemExit) as exc:
        cli.main(["serve", "--host-kv-cache-memory", "-1"])
    assert exc.value.code == 2 and "--host-kv-cache-memory" in capsys.readouterr().err
    cache = engine_config_from_args(cli.build_parser().parse_args(
        ["serve", "--host-kv-write-policy", "through", "--host-kv-write-through-hits", "3"])).cache
    assert (cache.host_kv_write_policy, cache.host_kv_write_through_hits) == ("through", 3)
    with pytest.raises(SystemExit):
        cli.main(["serve", "--host-kv-write-policy", "around"])
    assert "invalid choice: 'around'" in capsys.readouterr().err


def start(model_dir) -> RunningServer:
    args = cli.build_parser().parse_args([
        "serve", str(model_dir), "--served-model-name", BUILTIN_MODEL_NAME,
        "--host-kv-cache-memory", "1", "--kv-cache-memory", "640KiB", "--max-model-len", "512",
        "--max-num-batched-tokens", "512", "--max-num-seqs", "4"])
    engine = load_engine(engine_config_from_args(args))
    metrics, limits = ServerMetrics(), ServerLimits()
    server = Server(build_app(engine, limits=limits, metrics=metrics),
                    ServerArgs(port=0, log_level="warning", limits=limits), announce=False, metrics=metrics)
    thread = server.run_in_thread()  # binds the port: the url is known after it
    return RunningServer(server.url, engine, server, thread)


def test_a_prompt_evicted_to_the_host_tier_is_served_from_it_with_the_same_answer(model_dir):
    srv = start(model_dir)
    try:
        c = srv.client()
        first = c.completions.create(model=BUILTIN_MODEL_NAME, prompt=PROMPT, **GREEDY)
        for k in range(2):  # other long prompts evict the first one's blocks from the arena (one already does)
            c.completions.create(model=BUILTIN_MODEL_NAME, prompt=f"{k} other text {k} " * 25, max_tokens=1)
        again = c.completions.create(model=BUILTIN_MODEL_NAME, prompt=PROMPT, **GREEDY)
        cached = again.usage.prompt_tokens_details.cached_tokens
        m = srv.metrics()
        assert cached > 0 and first.usage.prompt_tokens_details.cached_tokens == 0
        assert m["atom_host_kv_hit_tokens_total"] == cached  # every cached token came back from the host
        assert m["atom_host_kv_bytes_in_total"] > 0 and m["atom_host_kv_bytes_out_total"] > 0
        assert m["atom_host_kv_pool_capacity_bytes"] > 0.99 * (1 << 30)
        assert again.choices[0].text == first.choices[0].text
    finally:
        srv.stop()
