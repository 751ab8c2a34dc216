"""``atom serve`` flags, the README-style smoke run, and ``atom bench serve``."""

import asyncio
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from atom.builtin_model import BUILTIN_MODEL_NAME
from atom.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from atom.entrypoints import cli
from atom.entrypoints.args import ServerArgs, engine_config_from_args, parse_bytes
from atom.entrypoints.serve_bench import BenchConfig, make_prompts, percentiles, run_bench
from support.usage_errors import assert_usage_error


@pytest.mark.parametrize("text,value", [("1024", 1024), ("2GiB", 2 << 30), ("512MiB", 512 << 20), ("1.5GB", 1500 * 10**6),
                                        ("64 KiB", 64 << 10), ("3kb", 3000)])
def test_kv_cache_memory_sizes_parse_in_bytes_and_binary_or_decimal_units(text, value):
    assert parse_bytes(text) == value


@pytest.mark.parametrize("text", ["lots", "", "0", "-1GiB", "2 gibibytes", "0.1B"])
def test_bad_sizes_are_a_clear_error_listing_the_accepted_forms(text):
    with pytest.raises(ValueError, match="KiB|more than 0"):
        parse_bytes(text)


def test_serve_flags_build_exactly_one_engine_config():
    args = cli.build_parser().parse_args(
        ["serve", "/models/x", "--max-model-len", "512", "--max-num-seqs", "3", "--max-num-batched-tokens", "64",
         "--kv-cache-memory", "8MiB", "--block-size", "16", "--no-enable-prefix-caching", "--served-model-name", "m",
         "--seed", "7", "--port", "0", "--api-key", "k", "--enforce-eager"])
    assert engine_config_from_args(args) == EngineConfig(
        ModelConfig(path="/models/x", served_model_name="m", seed=7, enforce_eager=True),
        SchedulerConfig(max_model_len=512, max_num_seqs=3, max_num_batched_tokens=64),
        CacheConfig(kv_cache_bytes=8 << 20, block_size=16, enable_prefix_caching=False))
    defaults = engine_config_from_args(cli.build_parser().parse_args(["serve"]))
    assert defaults == EngineConfig() and defaults.model.path is None


@pytest.mark.parametrize("argv,fragment", [
    (["serve", "--kv-cache-memory", "lots"], "is not a size"),
    (["serve", "--port", "70000"], "not a port"),
    (["serve", "--max-num-seqs", "0"], "must be >= 1"),
    (["serve", "--max-model-len", "1"], "max_model_len=1"),
    (["bench", "serve", "--base-url", "http://example.com:8000"], "loopback"),
    (["bench", "serve", "--shared-prefix-ratio", "2"], "shared_prefix_ratio"),
])
def test_bad_flags_exit_with_status_2_and_the_reason(argv, fragment, capsys):
    assert_usage_error(cli.main, argv, fragment, capsys)


def test_server_args_reject_a_blank_api_key():
    with pytest.raises(ValueError, match="api_key"):
        ServerArgs(api_key="  ")


def test_serving_a_directory_that_does_not_exist_fails_with_status_2(tmp_path, capsys):
    assert cli.main(["serve", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_bench_prompts_share_exactly_the_requested_prefix_and_are_seeded():
    cfg = BenchConfig(num_requests=5, prompt_len=20, shared_prefix_ratio=0.4, seed=3)
    prompts = make_prompts(cfg)
    assert all(len(p) == 20 and p[:8] == prompts[0][:8] for p in prompts)
    assert len({tuple(p[8:]) for p in prompts}) == 5
    assert make_prompts(cfg) == prompts


def test_percentiles_are_nearest_rank():
    assert percentiles(list(range(1, 101))) == {"p50": 50, "p90": 90, "p99": 99}
    assert percentiles([]) == {} and percentiles([7.0]) == {"p50": 7.0, "p90": 7.0, "p99": 7.0}


def test_bench_serve_reports_throughput_latencies_and_the_cached_ratio(server):
    cfg = BenchConfig(base_url=server.url, num_requests=6, concurrency=2, prompt_len=33, output_len=4,
                      shared_prefix_ratio=1.0)
    report = asyncio.run(run_bench(cfg))
    assert (report.completed, report.failed) == (6, 0)
    assert report.output_throughput > 0 and set(report.ttft_ms) == {"p50", "p90", "p99"}
    assert report.tpot_ms["p50"] > 0 and report.e2e_ms["p99"] >= report.ttft_ms["p99"]
    assert 0 < report.cached_token_ratio < 1  # identical prompts: all but the first hit the cache
    paced = asyncio.run(run_bench(BenchConfig(base_url=server.url, num_requests=3, concurrency=3, request_rate=50.0,
                                              prompt_len=8, output_len=2)))
    assert paced.completed == 3 and not math.isnan(paced.duration_s)
    assert "TTFT ms" in report.format()


def _atom_command() -> list[str]:
    script = Path(sys.executable).parent / "atom"
    return [str(script)] if script.exists() else [sys.executable, "-m", "atom.entrypoints.cli"]


@pytest.mark.slow
def test_the_readme_run_command_serves_one_request_and_stops_cleanly(model_dir):
    env = {**os.environ, "ATOM_CACHE_DIR": str(model_dir.parent)}  # reuse the session's built-in model
    proc = subprocess.Popen([*_atom_command(), "serve", "--port", "0", "--max-model-len", "128",
                             "--kv-cache-memory", "16MiB", "--max-num-seqs", "4", "--log-level", "warning"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline, url = time.monotonic() + 90, None
        while url is None and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            if line.startswith("atom: serving at "):
                url = line.split()[3].removesuffix("/v1")
        assert url is not None, f"no URL announced; stderr: {proc.stderr.read() if proc.poll() is not None else ''}"
        r = httpx.post(f"{url}/v1/completions", json={"model": BUILTIN_MODEL_NAME, "prompt": "hi", "max_tokens": 3},
                       timeout=60)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] >= 1
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert proc.returncode == 0, proc.stderr.read()


@pytest.mark.slow
def test_the_stall_scenario_reports_every_attack_with_its_status_and_ratios(server):
    from atom.entrypoints.stall_bench import ATTACKS, format_stall, run_stall_bench

    idle, results = asyncio.run(run_stall_bench(server.url, BUILTIN_MODEL_NAME, scale=0.01, output_len=8))
    assert idle > 0 and [r.attack for r in results] == list(ATTACKS)
    assert all(r.status in (200, 400, 413) for r in results)  # answered (at this scale some fit), never a 5xx
    assert results[0].status == 400 and results[-1].status == 400  # over the char limit; over max_model_len
    assert all(r.median_gap_ratio > 0 and r.health_max_ms > 0 for r in results)
    assert format_stall(idle, results, 0.01).count("\n") == len(ATTACKS) + 1


@pytest.mark.slow
def test_the_stall_scenario_runs_only_the_attacks_named_in_table_order(server):
    from atom.entrypoints.stall_bench import run_stall_bench

    _, results = asyncio.run(run_stall_bench(server.url, BUILTIN_MODEL_NAME, scale=0.01, output_len=4,
                                             attacks=["text-at-limit", "control-tiny-400"]))
    assert [(r.attack, r.status) for r in results] == [("control-tiny-400", 400), ("text-at-limit", 400)]


def test_the_stall_scenario_refuses_an_unknown_attack_name_before_connecting():
    from atom.entrypoints.stall_bench import run_stall_bench

    with pytest.raises(ValueError, match="unknown attack.s. text-9MB; known: control-tiny-400, text-4MB"):
        asyncio.run(run_stall_bench("http://127.0.0.1:9", "m", attacks=["text-9MB"]))
