"""The parallel flags and config: what they build, and the clear errors for what cannot work."""

from __future__ import annotations

import pytest

from atom.config import CacheConfig, EngineConfig, ModelConfig, ParallelConfig, SchedulerConfig
from atom.entrypoints import cli
from atom.entrypoints.args import engine_config_from_args
from atom.engine_builder import build_engine


def test_the_parallel_flags_build_the_parallel_config():
    args = cli.build_parser().parse_args(["serve", "-tp", "2", "--enable-expert-parallel",
                                          "--distributed-executor-backend", "external_launcher"])
    assert engine_config_from_args(args).parallel == ParallelConfig(
        tensor_parallel_size=2, enable_expert_parallel=True, distributed_executor_backend="external_launcher")
    assert engine_config_from_args(cli.build_parser().parse_args(["serve"])).parallel == ParallelConfig()


@pytest.mark.parametrize("argv,fragment", [
    (["serve", "--tensor-parallel-size", "0"], "must be >= 1"),
    (["serve", "--distributed-executor-backend", "ray"], "invalid choice"),
])
def test_bad_parallel_flags_exit_with_status_2_and_the_reason(argv, fragment, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.main(argv)
    assert exit_.value.code == 2 and fragment in capsys.readouterr().err


def test_an_unknown_executor_backend_is_refused_listing_the_accepted_ones():
    with pytest.raises(ValueError, match="distributed_executor_backend='ray'; accepted: mp, external_launcher"):
        ParallelConfig(2, distributed_executor_backend="ray")


def test_a_size_that_does_not_split_the_model_fails_before_any_worker_starts(tiny_dir):
    config = EngineConfig(ModelConfig(path=str(tiny_dir)), SchedulerConfig(max_num_seqs=2, max_model_len=64),
                          CacheConfig(kv_cache_bytes=4 << 20), ParallelConfig(3))
    with pytest.raises(ValueError, match=r"vocab_size=512 is not a multiple of the parallel size 3.*\[1, 2\]"):
        build_engine(config)


def test_data_parallel_replicas_multiply_the_ranks_and_own_consecutive_ranks():
    par = ParallelConfig(2, data_parallel_size=3)
    assert par.world_size == 6
    assert [par.replica_of(r) for r in range(6)] == [0, 0, 1, 1, 2, 2]
    with pytest.raises(ValueError, match="outside a group of 6 ranks"):
        par.replica_of(6)


def test_a_data_parallel_size_below_one_is_refused():
    with pytest.raises(ValueError, match="data_parallel_size=0 must be an integer >= 1"):
        ParallelConfig(data_parallel_size=0)
