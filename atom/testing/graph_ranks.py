"""Tensor- and expert-parallel ranks replaying their own decode graphs, on the CPU: two gloo ranks, each in a
spawned process under the CPU emulation of CUDA-graph capture (:mod:`atom.testing.graph_emulation`).

Each rank builds its shard and runner as a served rank does (:func:`atom.parallel.worker.build_rank_runner`);
rank 0 runs the short scenario of :mod:`atom.testing.graph_cases` and broadcasts every batch before running it,
rank 1 runs what it receives (:func:`atom.parallel.worker.serve_steps`), exactly the path of a served group. So
in ``graph`` mode every rank copies each broadcast batch into its own bucketed inputs and replays its own
graph, whose recorded collectives (all-reduces of the row-parallel outputs and the MoE, the head's
all-gather) meet the other rank's. The scenario runs in ``graph``, ``padded`` and ``eager`` mode (routed
experts on ``fused_moe``'s grouped reference in all three, ``host_free_experts``); each rank saves what it
saw to ``out_dir / rank{r}.pt``.
"""

from __future__ import annotations

from pathlib import Path

import torch

from atom.config import CacheConfig, EngineConfig, ModelConfig, ParallelConfig, SchedulerConfig
from atom.kv.block_manager import BlockManager
from atom.kv.kv_layout import KvLayout
from atom.model_engine.llm_engine import LLMEngine
from atom.model_engine.scheduler import Scheduler
from atom.models.deepseek_v4.loader import read_config
from atom.parallel.process_group import RankGroup, free_port, join
from atom.parallel.worker import RankSpec, build_rank_runner, serve_steps
from atom.step_contract import RunnerOutput, ScheduledBatch
from atom.testing.graph_cases import SHORT_LEN, CaseRun, recording_runner, run_requests
from atom.testing.graph_emulation import cuda_graph_emulation

__all__ = ["MODES", "rank_runs", "run_ranks"]

MODES = ("graph", "padded", "eager")
RANKS = 2


class _Broadcasting:
    """Rank 0's runner: every batch goes to the other ranks, then runs here (``DistributedRunner.execute``)."""

    def __init__(self, local, group: RankGroup) -> None:
        self.local, self.group = local, group

    def execute(self, batch: ScheduledBatch) -> RunnerOutput:
        self.group.broadcast(batch)
        return self.local.execute(batch)


def _config(model_dir: str, parallel: ParallelConfig) -> EngineConfig:
    limits = SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=4, max_model_len=SHORT_LEN)
    spec = read_config(model_dir).kv_spec("fp32", include_mtp=False)
    kv = KvLayout.for_chunks(spec, 64, limits, CacheConfig()).kv_cache_bytes
    return EngineConfig(ModelConfig(path=model_dir, dtype="float32"), limits,
                        CacheConfig(kv_cache_bytes=kv, enable_prefix_caching=False), parallel)


def _rank_main(rank: int, init_method: str, model_dir: str, parallel: ParallelConfig, out_dir: str) -> None:
    torch.set_num_threads(1)
    config = _config(model_dir, parallel)
    seen: dict[str, dict] = {}
    with cuda_graph_emulation(), torch.no_grad():
        group = join(rank, RANKS, init_method, "cpu")
        for mode in MODES:
            runner, _ = build_rank_runner(RankSpec(config, model_dir, poison=True, kernel_backend="torch"), group,
                                          graph_mode=mode, host_free_experts=True)
            logits: list[torch.Tensor] = []
            buckets: list[int] = []
            recording_runner(runner, logits, buckets)
            tokens: list[list[int]] = []
            if rank == 0:
                sched = Scheduler(config.scheduler, BlockManager(runner.views.layout, config.cache), eos_token_id=None)
                tokens = run_requests(LLMEngine(sched, _Broadcasting(runner, group), max_model_len=SHORT_LEN))
                group.broadcast(None)
            else:
                serve_steps(group, runner)
            graphs = 0 if runner.decode is None or runner.decode.pool is None else len(runner.decode.graphs)
            seen[mode] = dict(tokens=tokens, logits=logits, buckets=buckets, graphs=graphs)
        group.leave()
    torch.save(seen, Path(out_dir) / f"rank{rank}.pt")


def run_ranks(model_dir: str | Path, parallel: ParallelConfig, out_dir: str | Path, timeout: float = 1800.0
              ) -> list[dict[str, dict]]:
    """Run the scenario on a group of 2 ranks of ``parallel`` over the checkpoint ``model_dir``: what each rank
    saw per mode (``tokens`` (rank 0), ``logits`` of every step, ``buckets``, ``graphs`` captured)."""
    if parallel.world_size != RANKS or parallel.data_parallel_size != 1:
        raise ValueError(f"run_ranks runs {RANKS} tensor-parallel ranks (data_parallel_size 1), got {parallel}")
    return spawn_saved_ranks(_rank_main, (str(model_dir), parallel, str(out_dir)), RANKS, out_dir, timeout)


def spawn_saved_ranks(target, args: tuple, size: int, out_dir: str | Path, timeout: float) -> list:
    """Run ``target(rank, init_method, *args)`` in ``size`` spawned processes of one group and load what each
    saved to ``out_dir / rank{r}.pt``; a rank still running after ``timeout`` seconds is killed, and any rank
    that did not exit with status 0 is a RuntimeError naming every rank's exit code."""
    init_method = f"tcp://127.0.0.1:{free_port()}"
    ctx = torch.multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=target, args=(r, init_method, *args), daemon=True) for r in range(size)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout)
    for p in procs:
        if p.is_alive():
            p.kill()
    codes = [p.exitcode for p in procs]
    if codes != [0] * size:
        raise RuntimeError(f"rank processes exited with {codes}")
    return [torch.load(Path(out_dir) / f"rank{r}.pt") for r in range(size)]


def rank_runs(seen: dict[str, dict]) -> dict[str, CaseRun]:
    """Rank 0's runs per mode as :class:`CaseRun`s (for :func:`atom.testing.graph_checks.compare_runs`)."""
    return {mode: CaseRun(s["tokens"], s["logits"], s["buckets"]) for mode, s in seen.items()}
