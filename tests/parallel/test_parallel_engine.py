"""The engine over 2 gloo ranks computes what it computes on one: same greedy tokens and every
step's logits within 1e-5 relative, through chunked prefill, decode, a prefix hit that restores
the CSA boundary state from the (NaN-poisoned) arena, and a preemption forced by a 2-chunk arena.

Rank 0 is this process; ``build_engine`` spawns rank 1 (the path ``atom serve`` takes)."""

from __future__ import annotations

import pytest
import torch

from atom.config import CacheConfig, EngineConfig, ModelConfig, ParallelConfig, SchedulerConfig
from atom.model_engine.kv_layout import KvLayout
from atom.engine_builder import build_engine
from atom.models.deepseek_v4.loader import read_config as load_config
from atom.parallel.executor import DistributedRunner
from atom.sampling_params import SamplingParams

pytestmark = pytest.mark.slow

PROMPT = [(53 * i + 7) % 500 + 1 for i in range(40)]
CONCURRENT = [[(31 * i + 3 * n) % 500 + 1 for i in range(n)] for n in (20, 28, 36, 44)]
MODES = {
    "tp2": ParallelConfig(2),
    "ep2-replicated-attention": ParallelConfig(2, enable_expert_parallel=True, replicate_attention=True),
    "tp2+ep2": ParallelConfig(2, enable_expert_parallel=True),
}


def make_engine(tiny_dir, parallel: ParallelConfig):
    limits = SchedulerConfig(max_num_batched_tokens=24, max_num_seqs=4, max_model_len=512)
    kv = KvLayout.for_chunks(load_config(tiny_dir).kv_spec("fp32", include_mtp=False), 5, limits).kv_cache_bytes
    config = EngineConfig(ModelConfig(path=str(tiny_dir)), limits, CacheConfig(kv_cache_bytes=kv), parallel)
    return build_engine(config, keep_logits=True, poison=True)


def run(engine, prompts, max_tokens, steps):
    seqs = []
    for p in prompts:
        engine.add_request(p, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True))
        seqs.append(engine.scheduler.waiting[-1])
    while engine.has_unfinished_requests():
        batch = engine.scheduler.schedule()
        out = engine.runner.execute(batch)
        steps += [(s.seq_id, s.start_pos, s.restore_page, engine.runner.last_logits[s.seq_id]) for s in batch.seqs]
        engine.scheduler.postprocess(batch, out)
        engine.check_integrity()
    return seqs


def scenario(engine):
    """(outputs, steps, hit tokens, preemptions) of: a 32-token prefix, the 40-token prompt that hits
    it, then four requests whose long decodes outgrow the arena together."""
    steps: list = []
    run(engine, [PROMPT[:32]], 1, steps)
    hit = run(engine, [PROMPT], 2, steps)
    rest = run(engine, CONCURRENT, 40, steps)  # long decodes make the running requests grow into each other
    outputs = [s.output_token_ids for s in hit + rest]
    order = {sid: i for i, sid in enumerate(dict.fromkeys(s[0] for s in steps))}  # ids are process-global
    steps = [(order[sid], *rest) for sid, *rest in steps]
    return outputs, steps, hit[0].num_cached_tokens, engine.scheduler.num_preemptions


@pytest.fixture(scope="module")
def single_rank(tiny_dir):
    torch.set_num_threads(1)
    return scenario(make_engine(tiny_dir, ParallelConfig()))


def test_the_single_rank_scenario_exercises_a_csa_restore_and_a_preemption(single_rank):
    _, steps, hit_tokens, preemptions = single_rank
    assert hit_tokens == 32 and any(restore >= 0 for _, _, restore, _ in steps)
    assert preemptions >= 1
    assert any(logits.shape[0] > 1 for _, start, _, logits in steps if start > 0)  # a chunked prefill ran


@pytest.mark.parametrize("mode", list(MODES))
def test_two_ranks_give_the_single_rank_tokens_and_logits(tiny_dir, single_rank, mode):
    engine = make_engine(tiny_dir, MODES[mode])
    assert isinstance(engine.runner, DistributedRunner)
    try:
        outputs, steps, hit_tokens, preemptions = scenario(engine)
    finally:
        engine.runner.close()
    want_outputs, want_steps, want_hit, want_preemptions = single_rank
    assert outputs == want_outputs
    assert (hit_tokens, preemptions) == (want_hit, want_preemptions)
    assert [s[:3] for s in steps] == [s[:3] for s in want_steps]
    for (*_, got), (*_, want) in zip(steps, want_steps):
        assert not torch.isnan(got).any()
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))
