"""Code that runs inside a spawned rank of the data-parallel decode-graph test (importable by the child): two
attention replicas of one rank (the built-in tiny model's experts partitioned over both), each rank under the
CPU emulation of CUDA-graph capture; rank 0 drives both replicas' schedulers through the data-parallel runner
(replica 1 decodes longer, so replica 0 pads meanwhile), rank 1 serves its replica. The scenario runs in
``graph``, ``padded`` and ``eager`` mode; each rank saves what it saw to ``out_dir / rank{r}.pt``."""

from __future__ import annotations

from pathlib import Path

import torch

from atom.config import ParallelConfig
from atom.parallel.dp_runner import DataParallelRunner, serve_replica_steps
from atom.parallel.process_group import join
from atom.parallel.worker import RankSpec, build_rank_runner
from atom.testing.graph_emulation import cuda_graph_emulation
from atom.testing.graph_ranks import spawn_saved_ranks
from support.dp_lockstep import DECODE, PROMPTS, add_requests, engine_config, scheduler_for

MODES = ("graph", "padded", "eager")
PARALLEL = ParallelConfig(1, data_parallel_size=2, enable_expert_parallel=True)


def _drive(dp: DataParallelRunner, config) -> list[list[list[int]]]:
    """Both replicas' requests to the end through ``dp``; per replica its requests' output tokens."""
    schedulers = [scheduler_for(config) for _ in range(2)]
    seqs = [add_requests(s, prompts, decode) for s, prompts, decode in zip(schedulers, PROMPTS, DECODE)]
    while any(s.has_unfinished() for s in schedulers):
        batches = [s.schedule() if s.has_unfinished() else None for s in schedulers]
        for s, batch, out in zip(schedulers, batches, dp.execute_all(batches)):
            if batch is not None:
                s.postprocess(batch, out)
    return [[list(q.output_token_ids) for q in replica] for replica in seqs]


def dp_graph_rank(rank: int, init: str, model_dir: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    config = engine_config(model_dir, PARALLEL)
    seen: dict[str, dict] = {}
    with cuda_graph_emulation(), torch.no_grad():
        group = join(rank, 2, init, "cpu")
        for mode in MODES:
            runner, _ = build_rank_runner(RankSpec(config, model_dir, poison=True, kernel_backend="torch"), group,
                                          graph_mode=mode, host_free_experts=True)
            logits: list[torch.Tensor] = []
            sample_all = runner.sampler.sample_all
            runner.sampler.sample_all = lambda rows, *a, **k: logits.append(rows.clone()) or sample_all(rows, *a, **k)
            tokens, counts = [], {}
            if rank == 0:
                dp = DataParallelRunner(runner, group, PARALLEL)
                tokens = _drive(dp, config)
                counts = dict(bucketed=dp.bucketed_steps, fixed=dp.fixed_steps, padding=dp.padding_steps)
                group.broadcast(None)  # rank 1 leaves this mode's loop
                dp._closed = True  # the group stays for the next mode (close() would leave it)
            else:
                serve_replica_steps(group, runner, PARALLEL)
            graphs = 0 if runner.decode is None or runner.decode.pool is None else len(runner.decode.graphs)
            seen[mode] = dict(tokens=tokens, logits=logits, graphs=graphs, **counts)
        group.leave()
    torch.save(seen, Path(out_dir) / f"rank{rank}.pt")


def dp_graph_runs(model_dir, out_dir, timeout: float = 1800.0) -> list[dict[str, dict]]:
    """What each of the 2 ranks saw per mode."""
    return spawn_saved_ranks(dp_graph_rank, (str(model_dir), str(out_dir)), 2, out_dir, timeout)
