"""The ``atom serve`` side of parallel runs: ranks started by ``torchrun``, and stopping the workers.

With ``--distributed-executor-backend external_launcher`` every rank is a process ``torchrun``
started with the same ``atom serve`` command line. :func:`join_launched_ranks` joins them through
the launcher's environment (``env://``); rank 0 goes on to serve HTTP with a
:class:`DistributedRunner` over that group, every other rank runs :func:`serve_launched_rank`
(build its shard, then run the batches rank 0 broadcasts) and exits when rank 0 stops.
"""

from __future__ import annotations

import signal

from atom.config import EngineConfig
from atom.parallel.process_group import RankGroup, join

__all__ = ["join_launched_ranks", "serve_launched_rank", "close_runner"]


def join_launched_ranks(config: EngineConfig) -> RankGroup | None:
    """The launcher's group (None unless ``external_launcher``); ``ValueError`` if its size is wrong."""
    par = config.parallel
    if par.distributed_executor_backend != "external_launcher":
        return None
    from atom.model_executor.placement import resolve_device

    group = join(None, None, "env://", resolve_device(config.model.device).type)
    if group.size != par.world_size:
        group.leave()
        raise ValueError(f"torchrun started {group.size} ranks but --tensor-parallel-size is {par.world_size}; "
                         "start nnodes x nproc-per-node = tensor-parallel-size processes")
    return group


def serve_launched_rank(config: EngineConfig, group: RankGroup) -> None:
    """Rank > 0 under ``torchrun``: hold this rank's shard and run every step until rank 0 stops."""
    from atom import envs
    from atom.builtin_model import ensure_builtin_model
    from atom.model_executor.placement import resolve_model_dir
    from atom.parallel.executor import limit_cpu_threads
    from atom.parallel.worker import RankSpec, build_rank_runner, serve_steps

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # rank 0 stops this rank in order
    if group.device == "cpu":
        limit_cpu_threads(group.size)
    path = config.model.path
    model_dir = resolve_model_dir(path) if path else ensure_builtin_model()  # as rank 0 (build_engine) does
    runner, held = build_rank_runner(RankSpec(config, str(model_dir), poison=envs.load().debug_nan_arena,
                                              device=group.device.partition(":")[0]), group)
    group.gather(held)
    serve_steps(group, runner)
    group.leave()


def close_runner(runner: object) -> None:
    """Stop the workers of a parallel runner (nothing to do for a single-rank one)."""
    from atom.parallel.executor import DistributedRunner

    if isinstance(runner, DistributedRunner):
        runner.close()
