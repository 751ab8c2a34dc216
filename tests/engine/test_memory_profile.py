"""``--gpu-memory-utilization``: the arena's share of a GPU (weights, profiled step peak and graph pool
subtracted), the profiling run at the largest batch, and the refusals on the CPU (where
``--kv-cache-memory`` stays the rule)."""

import argparse

import pytest

from atom.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from atom.engine_builder import build_engine
from atom.entrypoints.args import add_serve_arguments, engine_config_from_args
from atom.model_executor.memory_profile import MemorySplit, gpu_memory_split, profile_steps
from atom.model_executor.model_runner import ModelRunner
from atom.testing.graph_cases import mtp_model
from support.decode_runs import thin_model

GIB = 1 << 30


def test_the_arena_gets_the_fraction_of_the_device_minus_weights_step_peak_and_graph_pool():
    split = MemorySplit(total=80 * GIB, utilization=0.9, weights=40 * GIB, step_peak=3 * GIB, graph_pool=GIB)
    assert split.kv_bytes == int(0.9 * 80 * GIB) - 44 * GIB
    assert split.describe() == ("GPU memory: 0.9 x 80.00 GiB = 72.00 GiB; weights 40.00 GiB, step peak 3.00 GiB, "
                                "graph pool 1.00 GiB, KV arena 28.00 GiB")
    with pytest.raises(ValueError, match="leaves no memory for the KV arena"):
        MemorySplit(total=80 * GIB, utilization=0.5, weights=40 * GIB, step_peak=GIB, graph_pool=0).check()


def test_the_profiling_run_executes_the_full_token_budget_then_a_decode_step_of_every_request():
    model = thin_model()
    limits = SchedulerConfig(max_num_batched_tokens=96, max_num_seqs=6, max_model_len=64)
    calls = []

    def measure(fn):
        calls.append(fn)
        fn()
        return 1000 * len(calls)

    def runner(m, layout, *, max_model_len):
        return ModelRunner(m, layout, max_model_len=max_model_len)

    tokens, prefill_peak, decode_peak = profile_steps(model, model.cfg.kv_spec("fp32", include_mtp=False),
                                                      CacheConfig(), limits, measure, runner)
    assert (tokens, prefill_peak, decode_peak, len(calls)) == (96, 1000, 2000, 2)


def test_with_speculative_decoding_the_profiled_decode_step_is_the_largest_verify_step_on_the_graph_inputs():
    """The graph pool is sized from the step the graphs capture: the largest bucket of requests, each
    verifying K drafts (``1 + K`` rows), run on the bucketed inputs as the profiling runner of a served
    engine with graphs runs it."""
    model = mtp_model()
    limits = SchedulerConfig(max_num_batched_tokens=24, max_num_seqs=4, max_model_len=64, speculative_num_tokens=2)
    decoded = []

    def runner(m, layout, *, max_model_len):
        r = ModelRunner(m, layout, max_model_len=max_model_len, speculative_num_tokens=2, graph_mode="padded")
        run = r.decode.run
        r.decode.run = lambda batch, tables: decoded.append((batch, run(batch, tables))) or decoded[-1][1]
        return r

    tokens, _, _ = profile_steps(model, model.cfg.kv_spec("fp32", include_mtp=True), CacheConfig(), limits,
                                 lambda fn: fn() or 0, runner)
    verify = [(batch, out) for batch, out in decoded if out is not None]
    assert tokens == 24 and len(verify) == 1
    batch, out = verify[0]
    assert [s.num_draft for s in batch.seqs] == [2, 2, 2, 2]
    assert out.step.token_ids.shape == (12,) and out.hidden.shape[0] == 12  # bucket 4 x (1 + 2 drafts)


def test_the_split_refuses_a_model_on_the_cpu_and_names_kv_cache_memory():
    model = thin_model()
    with pytest.raises(ValueError, match="--kv-cache-memory"):
        gpu_memory_split(model, model.cfg.kv_spec("fp32", include_mtp=False), CacheConfig(),
                         SchedulerConfig(max_model_len=64), 0.9, False, ModelRunner)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    return parser


def test_the_flag_reaches_the_cache_config_and_a_cpu_engine_refuses_it_before_loading():
    args = build_parser().parse_args(["--gpu-memory-utilization", "0.85", "--device", "cpu"])
    config = engine_config_from_args(args)
    assert config.cache.gpu_memory_utilization == 0.85
    cpu = EngineConfig(ModelConfig(path="/nonexistent/checkpoint", device="cpu"), SchedulerConfig(),
                       CacheConfig(gpu_memory_utilization=0.85))
    with pytest.raises(ValueError, match="on the CPU .* --kv-cache-memory"):
        build_engine(cpu)


@pytest.mark.parametrize("value", [0, 1.5, -0.2, True, "0.5"])
def test_a_utilization_outside_zero_to_one_is_a_value_error_naming_it(value):
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        CacheConfig(gpu_memory_utilization=value)


@pytest.mark.parametrize("text", ["0", "1.01", "abc"])
def test_the_cli_refuses_a_utilization_outside_zero_to_one(text, capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--gpu-memory-utilization", text])
    assert "--gpu-memory-utilization" in capsys.readouterr().err
