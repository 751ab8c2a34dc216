"""Code that runs inside a spawned rank of the data-parallel host-free test (importable by the child): two
attention replicas of one rank, the tiny model's routed experts partitioned over both, each replica its own
engine on its own prompts; every step the ranks swap their batches (as the data-parallel runner broadcasts
them), pick the step's exchange from both (``dp_runner.step_capacity``) and count the ops of the forward."""

from __future__ import annotations

import torch
import torch.distributed as dist

from atom.bench.op_count import SYNC_OPS, OpCounter
from atom.config import CacheConfig, SchedulerConfig
from atom.kv.block_manager import BlockManager
from atom.kv.kv_layout import plan_kv_layout
from atom.model_engine.llm_engine import LLMEngine
from atom.model_engine.scheduler import Scheduler
from atom.model_executor.model_runner import ModelRunner
from atom.models.deepseek_v4_serving import DeepseekV4ForServing
from atom.parallel.dp_runner import exchange_capacity, step_capacity
from atom.parallel.expert_exchange import set_exchange_capacity
from atom.parallel.process_group import join
from atom.parallel.shard_plan import ShardPlan
from atom.parallel.sharding import shard_model
from atom.sampling_params import SamplingParams
from support.exchange_ranks import CFG, load_full

#: prompt lengths per replica: 3 requests on replica 0, 2 on replica 1 (different decode batch sizes)
PROMPTS = ((11, 7, 16), (9, 13))
STEPS = 4  # one prefill step, then decode steps
MAX_LEN = 64


def _engine(model: DeepseekV4ForServing) -> LLMEngine:
    cache = CacheConfig(kv_cache_bytes=8 << 20, enable_prefix_caching=False)
    limits = SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=4, max_model_len=MAX_LEN)
    layout = plan_kv_layout(model.cfg.kv_spec("fp32", include_mtp=True), cache, limits)  # the tiny model has one
    sched = Scheduler(limits, BlockManager(layout, cache), eos_token_id=None)
    # the routed experts on fused_moe's grouped reference: the per-expert loop reads the routing back itself
    runner = ModelRunner(model, layout, max_model_len=MAX_LEN, kernel_backend="torch", host_free_experts=True)
    return LLMEngine(sched, runner, max_model_len=MAX_LEN)


def host_free_rank(rank: int, init: str, queue) -> None:
    """Replica ``rank`` of 2: its engine runs :data:`STEPS` steps; reports ``(rank, steps)`` with per step
    ``(capacity, rows, sync ops by name, ops by name)`` of its forward."""
    torch.set_num_threads(1)
    group = join(rank, 2, init, "cpu")
    plan = ShardPlan(rank, 2, split_attention=False, expert_parallel=True, n_experts=CFG.n_routed_experts,
                     replicas=2)
    model = shard_model(DeepseekV4ForServing(CFG, device="meta"), plan, group.comm.__class__(), "cpu",
                        expert_comm=group.comm)
    load_full(model, plan)
    engine = _engine(model.eval())
    params = SamplingParams(max_tokens=STEPS + 2, temperature=0.0, ignore_eos=True)
    for i, n in enumerate(PROMPTS[rank]):
        engine.add_request([(5 * rank + 3 * i + 7 * j) % CFG.vocab_size + 1 for j in range(n)], params)
    runner = engine.runner
    capacity = exchange_capacity(runner, 1)
    execute, forward, seen = runner.execute, runner._forward, []

    def counted_forward(step):
        with OpCounter() as c:
            out = forward(step)
        seen[-1] += (dict(c.ops),)
        return out

    def replica_execute(batch):
        both = [None, None]
        dist.all_gather_object(both, batch)  # what the data-parallel runner's broadcast gives every rank
        chosen = step_capacity(both, capacity, 1)
        set_exchange_capacity(runner.model, chosen)
        seen.append((chosen, batch.num_tokens))
        return execute(batch)

    runner.execute, runner._forward = replica_execute, counted_forward
    for _ in range(STEPS):
        engine.step()
    steps = [(cap, rows, {k: ops.get(k, 0) for k in SYNC_OPS}, ops) for cap, rows, ops in seen]
    queue.put((rank, capacity, steps))
    group.leave()
