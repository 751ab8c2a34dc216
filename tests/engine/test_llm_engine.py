"""LLMEngine: offline generate, streaming, seeds, stop strings, abort, stats."""

import pytest
import torch

from atom.model_executor.sampler import Sampler
from atom.sampling_params import SamplingParams


def test_generate_returns_finished_outputs_in_prompt_order_with_text(make_engine):
    engine = make_engine(budget=64)
    prompts = ["hello there", "a much longer prompt about the arena " * 3, "x"]
    outs = engine.generate(prompts, SamplingParams(max_tokens=7, temperature=0.0, ignore_eos=True), use_tqdm=False)
    assert [o.prompt_token_ids for o in outs] == [engine.tokenizer.encode(p) for p in prompts]
    for o in outs:
        assert o.finished and o.finish_reason == "length" and len(o.output_token_ids) == 7
        assert o.text == engine.tokenizer.decode(o.output_token_ids)


def test_streamed_step_outputs_add_up_to_the_final_output(make_engine):
    engine = make_engine(budget=16)
    rid = engine.add_request("streaming test prompt", SamplingParams(max_tokens=9, temperature=0.0, ignore_eos=True))
    ids, text, last = [], "", None
    while engine.has_unfinished_requests():
        for out in engine.step():
            assert out.request_id == rid
            ids += out.new_token_ids
            text += out.new_text
            last = out
    assert last.finished and ids == last.output_token_ids and text == last.text


def test_the_same_seed_gives_the_same_tokens_and_another_seed_does_not(make_engine):
    engine = make_engine(budget=64)
    def sample(seed):
        p = SamplingParams(max_tokens=12, temperature=1.0, seed=seed, ignore_eos=True)
        return engine.generate(["seeded prompt"], p, use_tqdm=False)[0].output_token_ids
    assert sample(1) == sample(1)
    assert sample(1) != sample(2)


@pytest.mark.slow  # 40 tokens for 6 prompts, twice: about 4 s of CPU
def test_a_seeded_request_preempted_midway_samples_the_same_tokens(make_engine):
    params = SamplingParams(max_tokens=40, temperature=1.0, seed=7, ignore_eos=True)
    prompts = [[(13 * i + n) % 500 + 1 for i in range(60)] for n in range(6)]
    calm = make_engine(budget=64).generate(prompts, params, use_tqdm=False)
    tight = make_engine(budget=64, num_chunks=6)
    squeezed = tight.generate(prompts, params, use_tqdm=False)
    assert tight.scheduler.num_preemptions > 0
    assert [o.output_token_ids for o in squeezed] == [o.output_token_ids for o in calm]


def test_stop_strings_cut_the_text_and_finish_the_request(make_engine):
    engine = make_engine(budget=64)
    free = engine.generate(["stop test"], SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True),
                           use_tqdm=False)[0]
    stop = free.text[5:7]
    assert len(stop) == 2
    out = engine.generate(["stop test"], SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True,
                                                        stop=(stop,)), use_tqdm=False)[0]
    assert out.finish_reason == "stop" and out.text == free.text[:free.text.find(stop)]
    assert len(out.output_token_ids) < 20


def test_abort_mid_generation_frees_the_requests_memory(make_engine):
    engine = make_engine(budget=16)
    rid = engine.add_request(list(range(1, 60)), SamplingParams(max_tokens=50, temperature=0.0, ignore_eos=True))
    for _ in range(6):
        engine.step()
    bm = engine.scheduler.bm
    assert bm.comp.pool.num_used() > 0
    assert engine.abort_request(rid) and not engine.abort_request(rid)
    assert bm.comp.pool.num_used() == 0 and bm.swa.pool.num_used() == 0 and bm.slots.num_held() == 0
    assert engine.has_unfinished_requests()  # its final output is still to stream
    [out] = engine.step()
    assert (out.request_id, out.finished, out.finish_reason) == (rid, True, "abort")
    assert not engine.has_unfinished_requests()
    engine.check_integrity()


def test_stats_report_prefix_reuse_and_tokens(make_engine):
    engine = make_engine(budget=64)
    p = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    prompt = list(range(1, 50))
    engine.generate([prompt], p, use_tqdm=False)
    out = engine.generate([prompt], p, use_tqdm=False)[0]
    stats = engine.stats()
    assert out.num_cached_tokens == 48
    assert stats.prefix.reused == 48 and stats.prefix.prompt_tokens == 98 and stats.generation_tokens == 6
    assert stats.num_running == 0 and set(stats.arena_bytes) == {"swa", "compress", "state", "free"}


def test_top_k_one_is_greedy_and_top_p_keeps_only_the_nucleus():
    sampler = Sampler(seed=0)
    logits = torch.tensor([0.0, 3.0, 1.0, 2.9])
    assert all(sampler.sample(logits, SamplingParams(temperature=1.0, top_k=1), i) == 1 for i in range(5))
    probs = Sampler.filtered_probs(logits, SamplingParams(temperature=1.0, top_p=0.5))
    assert probs.nonzero().flatten().tolist() == [1, 3]
    assert torch.isclose(probs.sum(), torch.tensor(1.0))


def test_aborts_that_leave_the_engine_idle_drop_the_runner_tables(make_engine):
    engine = make_engine(budget=16)
    for i in range(3):
        rid = engine.add_request([5, 6, 7, 8 + i], SamplingParams(max_tokens=4, ignore_eos=True))
        engine.step()
        engine.abort_request(rid)
        engine.step()
        assert engine.runner.tables.row_of == {}
