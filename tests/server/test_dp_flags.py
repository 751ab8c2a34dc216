"""``--data-parallel-size`` / ``-dp``: it composes with the tensor- and expert-parallel flags into one
ParallelConfig, and what data parallelism does not support is refused at parse time naming the flag."""

from __future__ import annotations

import pytest

from atom.entrypoints.args import engine_config_from_args
from atom.entrypoints.cli import build_parser, main


def config(*flags: str):
    return engine_config_from_args(build_parser().parse_args(["serve", *flags]))


def test_data_parallel_size_composes_with_tensor_and_expert_parallelism():
    par = config("-dp", "2", "--tensor-parallel-size", "2", "--enable-expert-parallel").parallel
    assert (par.data_parallel_size, par.tensor_parallel_size, par.enable_expert_parallel, par.world_size) == \
           (2, 2, True, 4)
    assert config("--data-parallel-size", "3").parallel.world_size == 3
    assert config().parallel.data_parallel_size == 1


@pytest.mark.parametrize("flags, named", [
    (["--speculative-num-tokens", "2"], "--speculative-num-tokens 2 needs --data-parallel-size 1"),
    (["--gpu-memory-utilization", "0.8"], "--gpu-memory-utilization profiles one GPU's memory"),
    (["--distributed-executor-backend", "external_launcher"], "--distributed-executor-backend mp"),
])
def test_what_data_parallelism_does_not_support_is_refused_with_exit_status_2(capsys, flags, named):
    with pytest.raises(SystemExit) as exc:
        main(["serve", "-dp", "2", *flags])
    assert exc.value.code == 2
    assert named in capsys.readouterr().err


def test_a_data_parallel_size_below_one_is_refused_naming_the_flag(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["serve", "--data-parallel-size", "0"])
    assert exc.value.code == 2 and "--data-parallel-size" in capsys.readouterr().err


@pytest.mark.parametrize("expert_parallel, reason", [(False, "moe_inter_dim=32"), (True, "n_routed_experts=8")])
def test_a_data_parallel_size_the_model_cannot_split_is_refused_before_any_worker_starts(model_dir, expert_parallel,
                                                                                        reason):
    from atom.config import CacheConfig, EngineConfig, ModelConfig, ParallelConfig, SchedulerConfig
    from atom.engine_builder import build_engine

    config = EngineConfig(ModelConfig(path=str(model_dir)), SchedulerConfig(max_model_len=128),
                          CacheConfig(kv_cache_bytes=16 << 20),
                          ParallelConfig(data_parallel_size=3, enable_expert_parallel=expert_parallel))
    with pytest.raises(ValueError, match=f"cannot be split over 3 ranks: the model's {reason}"):
        build_engine(config)
