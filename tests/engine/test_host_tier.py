"""The host tier restores prefixes bit-exactly: on the tiny model with a NaN-poisoned arena (and host
buffer), a prompt whose prefix the device evicted to the host tier and got back gives logits
bit-identical to the same prompt served from the device cache, and the greedy tokens of a cold run;
with fp32, bf16 and fp8 rows, for a hit followed by a partial CSA group and for a hit whose last
token starts a new HCA block, and when the request is preempted while its load is in flight."""

import pytest
import torch

from atom.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from atom.engine_builder import build_engine
from atom.kv.chunk_arena import ArenaEmpty
from atom.sampling_params import SamplingParams

GREEDY = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
ONE = SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True)
NUM_CHUNKS = 6  # a small arena: the flood below evicts the prompt's blocks


@pytest.fixture
def make_engine(tiny_dir):
    chunk_bytes: dict[str, int] = {}

    def build(kv, limits, cache):
        return build_engine(EngineConfig(ModelConfig(path=str(tiny_dir)), limits, cache), keep_logits=True,
                            poison=True, value_checks=True, quant_sim=kv == "fp8")

    def make(*, kv="fp32", host_chunks=40, prefix_caching=True, budget=64, max_seqs=4):
        limits = SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=max_seqs, max_model_len=512)
        if kv not in chunk_bytes:  # the serving model's own chunk size for this row format
            chunk_bytes[kv] = build(kv, limits, CacheConfig(kv_cache_dtype=kv)).runner.views.layout.chunk_bytes
        cb = chunk_bytes[kv]
        cache = CacheConfig(kv_cache_bytes=NUM_CHUNKS * cb, enable_prefix_caching=prefix_caching,
                            kv_cache_dtype=kv, host_kv_cache_bytes=host_chunks * cb)
        engine = build(kv, limits, cache)
        assert engine.runner.views.layout.num_chunks == NUM_CHUNKS
        return engine
    return make


def run(engine, tokens, params=GREEDY):
    """Run one request alone, checking integrity after every step; (sequence, [(start, logits)])."""
    seq = engine.sequence(engine.add_request(tokens, params))
    steps = []
    while engine.has_unfinished_requests():
        step = engine.step_detailed()
        steps += [(item.start_pos, step.output.logits[item.seq_id]) for item in step.batch.seqs
                  if item.seq_id == seq.seq_id]
        engine.check_integrity()
    return seq, steps


def flood(engine, n=8, length=400):
    for k in range(n):
        run(engine, [(17 * i + 101 * k + 3) % 500 + 1 for i in range(length)], ONE)


def assert_bit_identical(a, b):
    assert [s for s, _ in a] == [s for s, _ in b]
    for (_, x), (_, y) in zip(a, b):
        assert torch.equal(x, y)
        assert not torch.isnan(x).any()


def prompt(n):
    return [(53 * i + 7) % 500 + 1 for i in range(n)]


def host_hit_vs_device_hit(make_engine, tokens, kv):
    """(host-hit sequence and steps, device-hit steps, cold tokens) for ``tokens``."""
    device = make_engine(kv=kv, host_chunks=0)
    run(device, tokens)
    device_seq, device_steps = run(device, tokens)
    host = make_engine(kv=kv)
    run(host, tokens)
    flood(host)
    host_seq, host_steps = run(host, tokens)
    cold_seq, _ = run(make_engine(kv=kv, host_chunks=0, prefix_caching=False), tokens)
    assert device_seq.stats.reused_from_host == 0
    return host_seq, host_steps, device_seq, device_steps, cold_seq


@pytest.mark.slow
@pytest.mark.parametrize("kv", ["fp32", "bf16", "fp8"])
@pytest.mark.parametrize("length, hit", [(70, 64), (65, 64)], ids=["csa-group-continues", "hca-block-starts"])
def test_a_prefix_restored_from_the_host_tier_gives_the_device_cache_logits_and_cold_tokens(make_engine, kv,
                                                                                           length, hit):
    tokens = prompt(length)
    host_seq, host_steps, device_seq, device_steps, cold_seq = host_hit_vs_device_hit(make_engine, tokens, kv)
    assert device_seq.num_cached_tokens == hit
    assert host_seq.num_cached_tokens == hit and host_seq.stats.reused_from_host == hit
    assert_bit_identical(device_steps, host_steps)
    assert host_seq.output_token_ids == device_seq.output_token_ids == cold_seq.output_token_ids


def test_the_host_tier_counts_its_hit_and_the_bytes_it_moved(make_engine):
    engine = make_engine()
    tokens = prompt(70)
    first, _ = run(engine, tokens)
    flood(engine, n=2)  # two 400-token prompts already evict the 70-token prefix from 6 chunks
    before = engine.scheduler.bm.host.snapshot()
    assert before.host_bytes_out > 0 and before.host_bytes_in == 0 and before.host_hit_tokens == 0
    again, _ = run(engine, tokens)
    after = engine.scheduler.bm.host.snapshot()
    assert after.host_hit_tokens == again.stats.reused_from_host == 64
    assert after.host_bytes_in > 0 and engine.runner.host_copies.pages_moved > 0
    assert again.output_token_ids == first.output_token_ids


@pytest.mark.slow
def test_a_request_preempted_while_its_host_load_runs_still_gives_the_cold_tokens(make_engine):
    engine = make_engine(budget=16)
    tokens = prompt(70)
    cold, _ = run(make_engine(host_chunks=0, prefix_caching=False), tokens, SamplingParams(max_tokens=12,
                                                                                       temperature=0.0, ignore_eos=True))
    run(engine, tokens)
    flood(engine)
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    older = engine.sequence(engine.add_request(prompt(120)[::-1], params))
    engine.step()
    hit = engine.sequence(engine.add_request(tokens, params))
    bm, fail_once = engine.scheduler.bm, []
    real_grow = bm.grow

    def grow(seq, num_new, **kw):  # the older request's next growth finds no room: the younger one goes
        if seq is older and fail_once:
            fail_once.clear()
            raise ArenaEmpty("injected")
        return real_grow(seq, num_new, **kw)

    bm.grow = grow
    loaded = []
    while engine.has_unfinished_requests():
        step = engine.step_detailed()
        if any(order.src_pages for order in step.batch.host_loads):
            loaded.append(step.batch.step)
            fail_once.append(True)
        engine.check_integrity()
    assert loaded and hit.num_preemptions == 1 and hit.stats.reused_from_host == 64
    assert hit.output_token_ids == cold.output_token_ids
