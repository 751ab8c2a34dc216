"""The engine scenario the multi-rank tests compare against one rank: chunked prefill, decode, a prefix
hit that restores the CSA boundary state from the (NaN-poisoned) arena, and a preemption forced by a
5-chunk arena; every step's logits recorded."""

from __future__ import annotations

from atom.config import CacheConfig, EngineConfig, ModelConfig, ParallelConfig, SchedulerConfig
from atom.engine_builder import build_engine
from atom.kv.kv_layout import KvLayout
from atom.models.deepseek_v4.loader import read_config
from atom.sampling_params import SamplingParams

PROMPT = [(53 * i + 7) % 500 + 1 for i in range(40)]
CONCURRENT = [[(31 * i + 3 * n) % 500 + 1 for i in range(n)] for n in (20, 28, 36, 44)]


def make_engine(model_dir, parallel: ParallelConfig, quant_sim: str = "auto", device: str = "cpu"):
    """An engine over ``model_dir`` keeping every step's logits (``quant_sim``, ``device`` as ``ModelConfig``'s;
    fp32 weights)."""
    limits = SchedulerConfig(max_num_batched_tokens=24, max_num_seqs=4, max_model_len=512)
    kv = KvLayout.for_chunks(read_config(model_dir).kv_spec("fp32", include_mtp=False), 5, limits).kv_cache_bytes
    config = EngineConfig(ModelConfig(path=str(model_dir), quant_sim=quant_sim, device=device, dtype="float32"), limits, CacheConfig(kv_cache_bytes=kv), parallel)
    return build_engine(config, keep_logits=True, poison=True)


def run(engine, prompts, max_tokens, steps):
    seqs = []
    for p in prompts:
        rid = engine.add_request(p, SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True))
        seqs.append(engine.sequence(rid))
    while engine.has_unfinished_requests():
        step = engine.step_detailed()
        steps += [(s.seq_id, s.start_pos, s.restore_page, step.output.logits[s.seq_id]) for s in step.batch.seqs]
        engine.check_integrity()
    return seqs


def scenario(engine, decode_tokens: int = 40):
    """(outputs, steps, hit tokens, preemptions) of: a 32-token prefix, the 40-token prompt that hits
    it, then four requests whose long decodes outgrow the arena together."""
    steps: list = []
    run(engine, [PROMPT[:32]], 1, steps)
    hit = run(engine, [PROMPT], 2, steps)
    rest = run(engine, CONCURRENT, decode_tokens, steps)  # long decodes make the running requests grow into each other
    outputs = [s.output_token_ids for s in hit + rest]
    order = {sid: i for i, sid in enumerate(dict.fromkeys(s[0] for s in steps))}  # ids are process-global
    steps = [(order[sid], *rest) for sid, *rest in steps]
    return outputs, steps, hit[0].num_cached_tokens, engine.scheduler.num_preemptions
