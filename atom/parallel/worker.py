"""A model rank: its shard of the model, its copy of the KV arena, and the step loop of ranks > 0.

Every rank builds the same thing from the same :class:`RankSpec`: the shard of the model its
:class:`ShardPlan` names (of the serving model), and a :class:`ModelRunner` over an arena of the same layout (a pure
function of the model and the config, so every rank's page ``p`` is the same bytes). Rank 0 also
runs the scheduler (:mod:`executor`); every other rank runs :func:`serve_steps`: receive the step's
frozen batch, apply its table deltas and run it, until rank 0 broadcasts ``None`` (under data-parallel
attention :func:`atom.parallel.dp_runner.serve_replica_steps`: the list of every replica's batch, of
which the rank runs its replica's).

A spawned worker ignores Ctrl-C (the terminal sends it to every process of the group; rank 0 then
stops the workers in order) and exits by itself if its parent disappears.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from dataclasses import dataclass

import torch

from atom.config import EngineConfig
from atom.kv.kv_layout import KvLayout, plan_kv_layout
from atom.model_executor.decode_graphs import serving_graph_mode
from atom.model_executor.model_runner import ModelRunner
from atom.model_executor.placement import resolve_dtype, resolve_quant_sim, resolve_row_format
from atom.models.deepseek_v4.config import DeepseekV4Config
from atom.models.deepseek_v4_serving import DeepseekV4ForServing
from atom.parallel.process_group import RankGroup, join, replica_comm
from atom.parallel.shard_loader import load_sharded_checkpoint
from atom.parallel.shard_plan import ShardPlan
from atom.parallel.sharding import ParameterBytes, parameter_bytes

__all__ = ["RankSpec", "shard_plan_for", "layout_for", "build_rank_runner", "serve_steps", "worker_main"]


@dataclass(frozen=True)
class RankSpec:
    """What every rank needs to build its part (picklable: it travels to spawned workers)."""

    config: EngineConfig
    model_dir: str
    poison: bool = False
    kernel_backend: str | None = None
    batch_invariant: bool = False
    device: str = "cpu"  # the device type ("cpu" or "cuda"); each rank picks its GPU (``join``)
    eos_token_id: int | None = None  # for ``min_tokens`` in the sampler
    keep_logits: bool = False  # every rank runs the head over the same rows (its all-gather is collective)
    quant_sim: bool | None = None  # None: ``config.model.quant_sim`` (``auto``: on for a quantized checkpoint)


def shard_plan_for(config: EngineConfig, rank: int, size: int, cfg: DeepseekV4Config) -> ShardPlan:
    par = config.parallel
    return ShardPlan(rank, size, split_attention=not par.replicate_attention,
                     expert_parallel=par.enable_expert_parallel, n_experts=cfg.n_routed_experts,
                     replicas=par.data_parallel_size)


def layout_for(cfg: DeepseekV4Config, config: EngineConfig, *, on_gpu: bool) -> KvLayout:
    """The arena layout of the model's main layers under ``config`` (identical on every rank): MTP is not
    served, the row format is the single-rank engine's (``resolve_row_format``)."""
    row_format = resolve_row_format(config.cache.kv_cache_dtype, on_gpu=on_gpu,
                                    quantized="quantization_config" in cfg.extra)
    spec = cfg.kv_spec(row_format, include_mtp=False, block_size=config.cache.block_size)
    return plan_kv_layout(spec, config.cache, config.scheduler)


def build_rank_runner(spec: RankSpec, group: RankGroup, *, keep_logits: bool = False, graph_mode: str | None = None,
                      host_free_experts: bool | None = None) -> tuple[ModelRunner, ParameterBytes]:
    """This rank's runner over its shard, and the parameter bytes it holds. ``graph_mode``: how its decode
    steps run (None: :func:`serving_graph_mode` of its shard, the same on every rank: ``graph`` on GPUs when
    no layer reads a device value back, unless ``--enforce-eager``); in ``graph`` mode each rank captures and
    replays its own graphs, its collectives recorded in them, and copies every broadcast batch into its own
    bucketed inputs. ``host_free_experts``: as :class:`ModelRunner`'s."""
    from pathlib import Path

    from atom.models.deepseek_v4.loader import read_config

    c = spec.config
    cfg = read_config(spec.model_dir)
    plan = shard_plan_for(c, group.rank, group.size, cfg)
    quant_sim = resolve_quant_sim(c.model.quant_sim, Path(spec.model_dir)) if spec.quant_sim is None else spec.quant_sim
    device = torch.device(group.device)
    comm, expert_comm = group.comm, None
    if c.parallel.data_parallel_size > 1:  # dense layers within the replica, routed rows over every rank
        comm, expert_comm = replica_comm(group, c.parallel.tensor_parallel_size), group.comm
    model = load_sharded_checkpoint(spec.model_dir, plan, comm, dtype=resolve_dtype(c.model.dtype, device),
                                    device=device, batch_invariant=spec.batch_invariant, quant_sim=quant_sim,
                                    load_mtp=False, model_class=DeepseekV4ForServing,  # MTP is not served
                                    expert_comm=expert_comm)
    layout = layout_for(model.cfg, c, on_gpu=device.type != "cpu")
    if graph_mode is None:
        graph_mode = serving_graph_mode(model, enforce_eager=c.model.enforce_eager, keep_logits=keep_logits)
    runner = ModelRunner(model, layout, max_model_len=c.scheduler.max_model_len, seed=c.model.seed,
                         poison=spec.poison, kernel_backend=spec.kernel_backend, keep_logits=keep_logits,
                         eos_token_id=spec.eos_token_id, graph_mode=graph_mode, host_free_experts=host_free_experts)
    return runner, parameter_bytes(model, plan)


def serve_steps(group: RankGroup, runner: ModelRunner) -> None:
    """The loop of a rank > 0: run every batch rank 0 broadcasts until it sends ``None``."""
    while True:
        batch = group.broadcast(None)
        if batch is None:
            return
        runner.execute(batch)


def worker_main(spec: RankSpec, rank: int, size: int, init_method: str, parent_pid: int) -> None:
    """Entry point of a worker spawned by ``atom serve`` (rank ``rank`` of ``size``)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _exit_with_parent(parent_pid)
    if spec.device == "cpu":
        from atom.parallel.executor import limit_cpu_threads

        limit_cpu_threads(size)
    group = join(rank, size, init_method, spec.device)
    runner, held = build_rank_runner(spec, group, keep_logits=spec.keep_logits)
    group.gather(held)
    if spec.config.parallel.data_parallel_size > 1:
        from atom.parallel.dp_runner import serve_replica_steps

        serve_replica_steps(group, runner, spec.config.parallel)
    else:
        serve_steps(group, runner)
    group.leave()


def _exit_with_parent(parent_pid: int, period: float = 0.5) -> None:
    """End this process when its parent is gone (killed without a chance to stop its workers)."""

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(period)
        os._exit(3)

    threading.Thread(target=watch, name="atom-parent-watch", daemon=True).start()
