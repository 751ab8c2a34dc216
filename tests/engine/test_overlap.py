"""The overlapped engine loop gives the outputs of the sequential one (SchedulerConfig.overlap).

One suite of requests (greedy and seeded sampling, a stop string, a stop token id, an abort after a
number of tokens, an arena tight enough to preempt) runs three ways: sequentially (``--no-overlap``),
overlapped with the runner's steps applied when asked for (the CPU default), and overlapped with the
steps on the runner's step thread (the GPU default). Every request must stream the same tokens and
text and end for the same reason.
"""

from __future__ import annotations

import pytest

from atom.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from atom.engine_builder import build_engine
from atom.kv.kv_layout import KvLayout
from atom.model_engine.llm_engine import LLMEngine
from atom.sampling_params import SamplingParams

PROMPTS = [[(13 * i + n) % 500 + 1 for i in range(70 + 9 * n)] for n in range(6)]
ABORTED, ABORT_AFTER = 5, 20  # request 5 is aborted once it has streamed 20 tokens


def _engine(reference, tiny_dir, *, overlap: bool, step_thread: bool = False) -> LLMEngine:
    limits = SchedulerConfig(max_num_batched_tokens=48, max_num_seqs=6, max_model_len=256, overlap=overlap)
    kv = KvLayout.for_chunks(reference.cfg.kv_spec("fp32"), 4, limits, CacheConfig()).kv_cache_bytes
    cfg = EngineConfig(ModelConfig(path=str(tiny_dir)), limits, CacheConfig(kv_cache_bytes=kv))
    return build_engine(cfg, poison=True, value_checks=True, step_thread=step_thread)


def _suite(free_text: str, free_tokens: list[int]) -> list[SamplingParams]:
    """The requests' params: ``free_text`` and ``free_tokens`` are requests 2's and 3's greedy outputs
    without stops, so the stop string and the stop token id are ones their runs meet."""
    greedy = dict(max_tokens=48, temperature=0.0, ignore_eos=True)
    seeded = dict(max_tokens=44, temperature=1.0, ignore_eos=True)
    return [SamplingParams(**greedy),
            SamplingParams(**seeded, seed=11),
            SamplingParams(**greedy, stop=(free_text[20:22],)),
            SamplingParams(**greedy, stop_token_ids=(free_tokens[30],)),
            SamplingParams(**seeded, seed=5, top_p=0.8, top_k=20),
            SamplingParams(**greedy)]


def _run(engine: LLMEngine, params: list[SamplingParams]) -> dict[int, tuple]:
    """Each request's non-empty outputs in order (new tokens, new text) and how it ended."""
    rids = [engine.add_request(p, sp) for p, sp in zip(PROMPTS, params)]
    index = {rid: i for i, rid in enumerate(rids)}
    streams: dict[int, list] = {i: [] for i in range(len(rids))}
    ended: dict[int, tuple] = {}
    streamed = 0
    while engine.has_unfinished_requests():
        for out in engine.step():
            i = index[out.request_id]
            if out.new_token_ids or out.new_text:
                streams[i].append((tuple(out.new_token_ids), out.new_text))
            if i == ABORTED:
                streamed += len(out.new_token_ids)
            if out.finished:
                ended[i] = (tuple(out.output_token_ids), out.text, out.finish_reason)
        if streamed >= ABORT_AFTER and ABORTED not in ended:
            assert engine.abort_request(rids[ABORTED])
        engine.check_integrity()
    return {i: (streams[i], ended[i]) for i in range(len(rids))}


@pytest.mark.slow
def test_overlapped_steps_stream_what_sequential_steps_stream_with_aborts_stops_and_preemption(reference, tiny_dir):
    sequential = _engine(reference, tiny_dir, overlap=False)
    free = sequential.generate(PROMPTS[2:4], SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True),
                               use_tqdm=False)
    params = _suite(free[0].text, list(free[1].output_token_ids))
    want = _run(sequential, params)
    assert sequential.scheduler.num_preemptions > 0
    assert [want[i][1][2] for i in range(6)] == ["length", "length", "stop", "stop", "length", "abort"]
    assert len(want[ABORTED][1][0]) == ABORT_AFTER
    for step_thread in (False, True):
        overlapped = _engine(reference, tiny_dir, overlap=True, step_thread=step_thread)
        assert overlapped.overlap
        got = _run(overlapped, params)
        assert overlapped.scheduler.num_preemptions > 0
        assert got == want, f"step_thread={step_thread}"
