"""Fake-device check: what one engine step would ask of a GPU, counted on a CPU-only machine.

    python -m atom.bench.gpu_readiness [--cases NAME,NAME] [--stacks N]

Builds thin DeepSeek-V4 models (:func:`atom.bench.forward.thin_config`: the real layer counts, compress
ratios, heads, experts and top-k of V4-Flash / V4-Pro with small widths) in the release format (FP8
linears, MXFP4 routed experts, ``quant_sim`` on, ``fp8_ds_mla`` KV rows), places their weights and arena
on a ``cuda`` device of fake tensors (:mod:`atom.bench.fake_device`) and runs the engine's steps with the
Triton kernel wrappers (checks, shapes and output allocation run; the launch itself is skipped). Each case
runs uncounted steps until its requests are in the state the named step needs, then counts one step whose
batch must be of the named kind (:mod:`atom.bench.step_kinds`: every request decoding for a decode case,
drafts on every request for the verify case, decode rows beside a prefill chunk for the mixed case; any
other step is an error, not a figure). Inside that step's ``ModelRunner.execute`` (tables, inputs, forward,
sampling, drafting) it counts:

* ``h2d``: blocking host-to-device copies; ``syncs``: device-to-host reads; ``data_dependent``: ops whose
  output shape depends on values; each is a stream sync on a GPU and forbidden inside graph capture;
* ``staged``: non-blocking host-to-device copies (the step's packed inputs from pinned memory) and
  ``token_reads``: non-blocking reads (the sampled token ids into pinned memory), counted apart.

Cases: decode at batch 1, 8 and 64 of Flash and Pro, a 2,048-token prefill chunk, a mixed step (one chunk
and decodes), an MTP draft + verify step, decode with mixed sampling parameters (seeded, top-p, penalties,
logit_bias, logprobs), and both ranks of a 2-rank tensor-parallel group (Flash sharded by
:func:`atom.parallel.sharding.shard_model`, ``moe_inter_dim`` 64 so each rank holds whole MXFP4 groups of
32 inputs) decoding at batch 8: two spawned processes joined by a gloo group, whose collectives on fake
tensors are shape-only (no data moves, nothing is counted); each rank runs the same engine steps (fake
reads give both the same tokens) and counts its own; and both replicas of a 2-replica data-parallel group
decoding at batch 8 with the experts partitioned over them (:mod:`atom.bench.gpu_readiness_dp`: the MoE rows
exchanged through the fixed-capacity exchange). ``--stacks N`` prints the N most frequent code sites
of each counted kind.

The last line is ``h2d=<int> syncs=<int> data_dependent=<int> graph_equal=<0|1>
width_follows_context=<0|1>``: the first three summed over the cases; the last two are the results of the
CUDA-graph capture emulation (replay bit-equal to eager on the same padded shapes, the unpadded eager
run's tokens) and of the index-width check (:func:`graph_checks`, run on the CPU).
"""

from __future__ import annotations

import argparse
import multiprocessing
import queue
import tempfile
import time
from collections import Counter
from dataclasses import dataclass

import torch

from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily

from atom.bench.fake_device import DeviceAccessCounter, fake_cuda, to_fake_cuda
from atom.bench.forward import thin_config
from atom.bench.step_kinds import check_step, describe_step, warm_up
from atom.comm import Comm
from atom.config import CacheConfig, SchedulerConfig
from atom.kv.block_manager import BlockManager
from atom.kv.kv_layout import KvLayout, plan_kv_layout
from atom.model_engine.llm_engine import LLMEngine
from atom.model_engine.scheduler import Scheduler
from atom.model_executor.model_runner import ModelRunner
from atom.models.deepseek_v4.checkpoint import release_format
from atom.models.deepseek_v4.config import DeepseekV4Config
from atom.models.deepseek_v4.layers import Linear
from atom.models.deepseek_v4.loader import _DEQUANT_ON_LOAD as DEQUANT_ON_LOAD
from atom.models.deepseek_v4_serving import DeepseekV4ForServing
from atom.parallel.shard_plan import ShardPlan
from atom.parallel.sharding import shard_model
from atom.sampling_params import SamplingParams
from atom.spec_decode.draft_source import RunnerDrafts

__all__ = ["CASES", "Case", "release_config", "case_scheduler", "add_prompts", "measure", "release_meta_model", "release_model",
           "run_case", "run_tp_case", "main"]

GREEDY = SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True)
MIXED = (
    SamplingParams(max_tokens=64, temperature=0.8, seed=7, ignore_eos=True),
    SamplingParams(max_tokens=64, temperature=1.0, top_p=0.9, top_k=20, ignore_eos=True),
    SamplingParams(max_tokens=64, temperature=0.7, presence_penalty=0.5, frequency_penalty=0.3,
                   repetition_penalty=1.2, ignore_eos=True),
    SamplingParams(max_tokens=64, temperature=0.0, logit_bias=((5, 2.0), (9, -1.0)), ignore_eos=True),
    SamplingParams(max_tokens=64, temperature=0.9, min_p=0.1, logprobs=3, ignore_eos=True),
)


@dataclass(frozen=True)
class Case:
    """One measured step: ``model`` (flash / pro), the ``prompts`` lengths admitted first, the ``kind`` of step
    measured (:data:`STEP_KINDS`: the steps before it run uncounted until the requests reach the state that
    kind needs, :func:`warm_up`, and the measured step's batch must be of that kind, :func:`check_step`), the
    sampling parameters (cycled over requests), the token budget (0: every prompt in one step, and room for
    every request's drafts) and the number of MTP drafts; ``tp`` > 1: every rank of a tensor-parallel group
    of that size runs it (:func:`run_tp_case`), or with ``dp`` every rank of that many data-parallel
    attention replicas of one rank, exchanging MoE rows (:mod:`atom.bench.gpu_readiness_dp`)."""

    name: str
    model: str
    prompts: tuple[int, ...]
    kind: str
    params: tuple[SamplingParams, ...] = (GREEDY,)
    budget: int = 0
    drafts: int = 0
    tp: int = 1
    dp: bool = False


CASES = (
    Case("flash decode b1", "flash", (40,), "decode"),
    Case("flash decode b8", "flash", (40,) * 8, "decode"),
    Case("flash decode b64", "flash", (40,) * 64, "decode"),
    Case("flash prefill 2048", "flash", (2048,), "prefill", budget=2048),
    Case("flash mixed", "flash", (40,) * 4 + (300,), "mixed", budget=4 * 40 + 100),
    Case("flash mtp verify", "flash", (40,) * 4, "verify", drafts=2),
    Case("flash sampler mixed", "flash", (40,) * 10, "decode", params=MIXED),
    Case("pro decode b1", "pro", (40,), "decode"),
    Case("pro decode b8", "pro", (40,) * 8, "decode"),
    Case("pro decode b64", "pro", (40,) * 64, "decode"),
    Case("flash tp2 decode b8", "flash", (40,) * 8, "decode", tp=2),
    Case("flash dp2 decode b8", "flash", (40,) * 8, "decode", budget=8 * 40, tp=2, dp=True),
)
TP_TIMEOUT_S = 3600  # a rank's whole run (start-up, model, the first forward stacking every expert, steps)


def release_model(kind: str, mode: FakeTensorMode, *, mtp: bool = False) -> DeepseekV4ForServing:
    """The thin ``kind`` model in the release format (:func:`release_meta_model`) with fake weights on ``cuda``.
    Planned on ``meta`` outside the fake mode: the plan clones meta prototypes into parameters, and a clone
    made under the mode would be a fake tensor, which ``nn.Parameter`` cannot wrap."""
    with unset_fake_temporarily():
        meta = release_meta_model(kind, mtp=mtp)
    return to_fake_cuda(meta, mode).eval()


def release_config(kind: str, *, mtp: bool = False, tp: int = 1) -> DeepseekV4Config:
    """The thin ``kind`` configuration the cases run: ``quant_sim`` on, ``moe_inter_dim`` 32 per rank (whole
    MXFP4 groups of 32 inputs on each of ``tp`` ranks), one MTP layer (sliding-window only) when ``mtp``."""
    cfg = thin_config(kind)
    return cfg.replace(moe_inter_dim=32 * tp, n_mtp_layers=1 if mtp else 0, quant_sim=True,
                       compress_ratios=cfg.compress_ratios + ((0,) if mtp else ()))  # the MTP layer is SWA


def release_meta_model(kind: str, *, mtp: bool = False, rank: int = 0, tp: int = 1, comm: Comm | None = None
                       ) -> DeepseekV4ForServing:
    """The thin ``kind`` model on ``meta`` in the release format (FP8 linears, MXFP4 routed experts, each
    Linear in the format the loader gives a release checkpoint's tensor), ``quant_sim`` on; ``tp`` > 1:
    rank ``rank``'s shard, its layers combining over ``comm`` (sharded outside fake tensors: the shard's
    ``to_empty`` swaps parameters, which fake tensors refuse)."""
    cfg = release_config(kind, mtp=mtp, tp=tp)
    model = DeepseekV4ForServing(cfg, device="meta")
    for path, module in model.named_modules():
        fmt = release_format(f"{path}.weight", fp8=True, fp4_experts=True)
        if isinstance(module, Linear) and fmt != "dense" and not DEQUANT_ON_LOAD.search(path):
            module.set_format(fmt, act_quant=True)
    if tp > 1:
        shard_model(model, ShardPlan(rank, tp, n_experts=cfg.n_routed_experts), comm, "meta")
    return model


def case_scheduler(cfg: DeepseekV4Config, case: Case, max_model_len: int) -> tuple[Scheduler, KvLayout]:
    """The scheduler of ``case`` for a model of ``cfg`` and the arena layout it plans. The budget is the
    case's, or every prompt in one step (and every request's drafts), so the steps before the measured one
    are few: a step costs fake tensors per op, not per token."""
    budget = case.budget or max(sum(case.prompts), len(case.prompts) * (1 + case.drafts))
    cache = CacheConfig(kv_cache_bytes=64 << 20, enable_prefix_caching=False, kv_cache_dtype="fp8")
    limits = SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=len(case.prompts),
                             max_model_len=max_model_len, speculative_num_tokens=case.drafts, overlap=False)
    layout = plan_kv_layout(cfg.kv_spec("fp8_ds_mla", include_mtp=bool(case.drafts)), cache, limits)
    sched = Scheduler(limits, BlockManager(layout, cache), eos_token_id=None,
                      drafter=RunnerDrafts() if case.drafts else None)
    return sched, layout


def _engine(model: DeepseekV4ForServing, case: Case, max_model_len: int) -> LLMEngine:
    sched, layout = case_scheduler(model.cfg, case, max_model_len)
    runner = ModelRunner(model, layout, max_model_len=max_model_len, kernel_backend="triton",
                         speculative_num_tokens=case.drafts)
    return LLMEngine(sched, runner, max_model_len=max_model_len)


def add_prompts(engine: LLMEngine, case: Case) -> None:
    """Admit ``case``'s prompts (fixed token ids), its sampling parameters cycled over them."""
    for i, n in enumerate(case.prompts):
        engine.add_request([(37 * i + 11 * j) % 1000 + 2 for j in range(n)], case.params[i % len(case.params)])


def measure(engine: LLMEngine, case: Case, counter: DeviceAccessCounter) -> str:
    """Run ``engine`` (``case``'s prompts admitted) to the state ``case.kind`` needs (:func:`warm_up`), then
    one more step whose ``runner.execute`` is counted by ``counter``, after :func:`check_step` accepted
    its batch (``RuntimeError`` otherwise, before anything is counted); the step's
    :func:`describe_step`."""
    n = len(case.prompts)
    warm_up(engine, case.kind, n, case.drafts, case.name)
    runner = engine.runner
    execute = runner.execute
    seen: list[str] = []

    def counted(batch):
        prompt_lens = {row.seq_id: engine.scheduler.by_id[row.seq_id].num_prompt_tokens for row in batch.seqs}
        check_step(batch, prompt_lens, case.kind, n, case.name)
        seen.append(describe_step(batch, prompt_lens))
        with counter:
            return execute(batch)

    runner.execute = counted
    try:
        engine.step()
    finally:
        runner.execute = execute
    if not seen:
        raise RuntimeError(f"{case.name}: the measured step ran no forward")
    return seen[0]


def run_case(case: Case, model: DeepseekV4ForServing) -> tuple[DeviceAccessCounter, str]:
    """Run ``case`` on ``model`` (already on the fake device); its measured step's count and description."""
    engine = _engine(model, case, 4096)
    add_prompts(engine, case)
    counter = DeviceAccessCounter()
    return counter, measure(engine, case, counter)


def _tp_rank(rank: int, case: Case, init_method: str, results: "multiprocessing.Queue") -> None:
    """One rank of ``case``'s tensor-parallel group, in a spawned process: its shard on fake ``cuda``,
    the case's steps, the counted step's accesses put on ``results`` as ``(rank, accesses, step)``."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=case.tp)
    try:
        meta = release_meta_model(case.model, mtp=bool(case.drafts), rank=rank, tp=case.tp,
                                  comm=Comm(rank, case.tp, dist.group.WORLD))
        with fake_cuda() as mode, torch.no_grad():
            counter, step = run_case(case, to_fake_cuda(meta, mode).eval())
            results.put((rank, counter.accesses, step))
    finally:
        dist.destroy_process_group()


def run_tp_case(case: Case) -> list[tuple[DeviceAccessCounter, str]]:
    """Every rank's count of ``case`` and its measured step (rank order): ``case.tp`` spawned processes in one
    gloo group."""
    from atom.bench.gpu_readiness_dp import dp_rank

    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    with tempfile.TemporaryDirectory() as tmp:
        target = dp_rank if case.dp else _tp_rank
        procs = [ctx.Process(target=target, args=(r, case, f"file://{tmp}/rendezvous", results), daemon=True)
                 for r in range(case.tp)]
        for p in procs:
            p.start()
        got: dict[int, tuple[list, str]] = {}
        deadline = time.monotonic() + TP_TIMEOUT_S
        while len(got) < case.tp:
            try:
                rank, accesses, step = results.get(timeout=5)
                got[rank] = (accesses, step)
            except queue.Empty:
                missing = [r for r in range(case.tp) if r not in got]
                if time.monotonic() > deadline or not all(procs[r].is_alive() for r in missing):
                    raise RuntimeError(f"{case.name}: ranks {missing} reported "
                                       f"nothing (exit codes {[p.exitcode for p in procs]}; "
                                       f"limit {TP_TIMEOUT_S} s)") from None
        for p in procs:
            p.join()
    return [(DeviceAccessCounter(got[r][0]), got[r][1]) for r in range(case.tp)]


def graph_checks() -> tuple[int, int]:
    """(graph_equal, width_follows_context), both run on the CPU, with the replay's figures printed:
    :func:`atom.testing.graph_checks.compare_replay` (decode steps replayed from emulated CUDA graphs equal
    eager decode on the same padded shapes bit for bit, and sample the unpadded eager run's tokens with
    logits within ``UNPADDED_BOUND``) and :func:`~atom.testing.graph_checks.index_widths_follow_context`
    (a 2K-context decode step has the same index widths and op shapes at max_model_len 4,096 and
    1,048,576)."""
    from atom.testing.graph_checks import UNPADDED_BOUND, compare_replay, index_widths_follow_context

    with torch.no_grad():
        replay = compare_replay()
        print(f"graph replay: bit-equal to eager on its shapes {int(replay.same_shapes)}, unpadded eager's tokens "
              f"{int(replay.tokens_equal)}, logits {replay.unpadded:.3g} of the step's largest from unpadded eager "
              f"(bound {UNPADDED_BOUND:g})", flush=True)
        return int(replay.equal), int(index_widths_follow_context())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default="", help="comma-separated case names (default: every single-process "
                        "case; the tensor- and data-parallel cases run only when named: two spawned ranks, 10-15 "
                        "minutes each on a loaded 2-core CPU machine)")
    parser.add_argument("--stacks", type=int, default=3, help="code sites printed per counted kind")
    args = parser.parse_args(argv)
    names = args.cases.split(",")
    chosen = [c for c in CASES if (c.name in names if args.cases else c.tp == 1)]
    if not chosen:
        parser.error(f"--cases {args.cases!r} names no case; cases: {', '.join(c.name for c in CASES)}")
    models: dict[tuple[str, bool], DeepseekV4ForServing] = {}
    totals: Counter[str] = Counter()
    print(f"{'case':26s} {'step':18s} {'h2d':>6s} {'syncs':>6s} {'data_dep':>8s} {'staged':>6s} {'token_rd':>8s}")
    with fake_cuda() as mode, torch.no_grad():
        for case in chosen:
            if case.tp > 1:
                continue
            key = (case.model, bool(case.drafts))
            if key not in models:
                models[key] = release_model(case.model, mode, mtp=bool(case.drafts))
            _report(case.name, *run_case(case, models[key]), totals, args.stacks)
    for case in chosen:
        if case.tp > 1:
            for rank, (counter, step) in enumerate(run_tp_case(case)):
                _report(f"{case.name} rank {rank}", counter, step, totals, args.stacks)
    graph_equal, widths = graph_checks()
    print(f"h2d={totals['h2d']} syncs={totals['syncs']} data_dependent={totals['data_dependent']} "
          f"graph_equal={graph_equal} width_follows_context={widths}")
    return 0


def _report(name: str, counter: DeviceAccessCounter, step: str, totals: Counter[str], stacks: int) -> None:
    """Print one case's row (its measured ``step`` as :func:`describe_step` gives it, and its ``stacks`` most
    frequent sites per counted kind); add it to ``totals``."""
    c = counter.counts()
    totals.update({k: c[k] for k in ("h2d", "syncs", "data_dependent")})
    print(f"{name:26s} {step:18s} {c['h2d']:6d} {c['syncs']:6d} {c['data_dependent']:8d} {c['staged_h2d']:6d} "
          f"{c['token_reads']:8d}", flush=True)
    for kind in ("h2d", "syncs", "data_dependent"):
        for site, n in counter.sites(kind).most_common(stacks):
            print(f"    {kind:14s} {n:5d}  {site}")


if __name__ == "__main__":
    raise SystemExit(main())
