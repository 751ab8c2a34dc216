"""Drive D replicas' schedulers in lock step over a data-parallel runner (``execute_all``), and the same
requests over one rank, recording every step's logits per request (for the data-parallel runner tests)."""

from __future__ import annotations

from atom.config import CacheConfig, EngineConfig, ModelConfig, ParallelConfig, SchedulerConfig
from atom.kv.block_manager import BlockManager
from atom.kv.kv_layout import KvLayout
from atom.model_engine.scheduler import Scheduler
from atom.model_engine.sequence import Sequence
from atom.models.deepseek_v4.loader import read_config
from atom.parallel.worker import RankSpec, layout_for
from atom.sampling_params import SamplingParams

#: Two replicas' requests: replica 0 a long prefill (chunked at 24 tokens) and a short one, replica 1 three
#: others; each decodes a few tokens.
PROMPTS = ([[(53 * i + 7) % 500 + 1 for i in range(40)], [(17 * i + 5) % 500 + 1 for i in range(9)]],
           [[(31 * i + 3 * n) % 500 + 1 for i in range(n)] for n in (20, 28, 13)])


def engine_config(model_dir, parallel: ParallelConfig, device: str = "cpu") -> EngineConfig:
    """fp32 weights on ``device`` ("cpu" or "cuda"), 24-token steps, an arena of 8 chunks per replica (per rank)."""
    limits = SchedulerConfig(max_num_batched_tokens=24, max_num_seqs=4, max_model_len=512)
    kv = KvLayout.for_chunks(read_config(model_dir).kv_spec("fp32", include_mtp=False), 8, limits).kv_cache_bytes
    return EngineConfig(ModelConfig(path=str(model_dir), dtype="float32", device=device), limits,
                        CacheConfig(kv_cache_bytes=kv), parallel)


def rank_spec(model_dir, parallel: ParallelConfig, device: str = "cpu") -> RankSpec:
    return RankSpec(engine_config(model_dir, parallel, device), str(model_dir), poison=True, device=device)


def scheduler_for(config: EngineConfig) -> Scheduler:
    """A scheduler over a block manager of the layout every rank binds (the row format follows the device)."""
    layout = layout_for(read_config(config.model.path), config, on_gpu=config.model.device != "cpu")
    return Scheduler(config.scheduler, BlockManager(layout, config.cache), eos_token_id=None)


def add_requests(scheduler: Scheduler, prompts: list[list[int]], max_tokens: int) -> list[Sequence]:
    seqs = [Sequence(p, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True),
                     scheduler.block_size) for p in prompts]
    for s in seqs:
        scheduler.add(s)
    return seqs


def lockstep(execute_all, schedulers: list[Scheduler], active: list[bool] | None = None) -> list[list]:
    """Step every scheduler that has work (``active[d]`` False: replica ``d`` is left idle, None) until all
    are done; per replica its steps' ``(request index, start, logits)``, request index in arrival order."""
    logs: list[list] = [[] for _ in schedulers]
    order: list[dict[int, int]] = [{} for _ in schedulers]
    active = active or [True] * len(schedulers)
    while any(s.has_unfinished() for s, on in zip(schedulers, active) if on):
        batches = [s.schedule() if on and s.has_unfinished() else None for s, on in zip(schedulers, active)]
        outs = execute_all(batches)
        for d, (s, batch, out) in enumerate(zip(schedulers, batches, outs)):
            if batch is None:
                assert out is None
                continue
            s.postprocess(batch, out)
            for item in batch.seqs:
                n = order[d].setdefault(item.seq_id, len(order[d]))
                logs[d].append((n, item.start_pos, out.logits[item.seq_id]))
    return logs


def release_all(execute_all, schedulers: list[Scheduler]) -> None:
    """One more step of empty batches carrying the finished requests' releases, so a runner reused by other
    schedulers has its table rows back (the replicas pad: nothing is scheduled)."""
    batches = [s.schedule() for s in schedulers]
    assert not any(b.seqs for b in batches)
    execute_all(batches)


#: Tokens each replica's requests decode: replica 1 runs on after replica 0 is done, so replica 0 pads.
DECODE = (4, 9)


def single_rank_steps(model_dir, decode=DECODE, **build) -> list[list]:
    """Per replica's :data:`PROMPTS`, the steps one rank runs for them alone (``build``: ``build_engine``
    options, e.g. ``quant_sim``)."""
    from atom.engine_builder import build_engine

    logs = []
    for prompts, tokens in zip(PROMPTS, decode):
        config = engine_config(model_dir, ParallelConfig())
        runner = build_engine(config, keep_logits=True, poison=True, **build).runner
        scheduler = scheduler_for(config)
        add_requests(scheduler, prompts, tokens)
        logs.append(lockstep(lambda batches: [runner.execute(batches[0])], [scheduler])[0])
    return logs


def check_steps(got: list, want: list) -> None:
    """Same requests and positions step by step; every step's logits finite and within 1e-5 relative."""
    import torch

    assert [s[:2] for s in got] == [s[:2] for s in want]
    for (*_, g), (*_, w) in zip(got, want):
        assert not torch.isnan(g).any()
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5 * float(w.abs().max()))
