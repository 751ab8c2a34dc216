"""The engine storing fp8_ds_mla rows and FP8 indexer keys computes what the reference model computes with its
quantization round-trips on (``quant_sim``): same greedy tokens and logits within 1e-4 relative at every step under
chunked prefill and preemption, and prefix hits stay bit-identical on a NaN-poisoned arena."""

import pytest
import torch
from engine.test_engine_vs_reference import prompts, reference_greedy, reference_logits, run_recording_logits
from engine.test_prefix_hits import PROMPT, after, assert_bit_identical, run

from atom.model_engine.unified_kv_arena import COMPRESS
from atom.sampling_params import SamplingParams

FP8 = dict(kv_cache_dtype="fp8", quant_sim=True)


def test_the_engine_binds_byte_rows_with_the_models_fp8_block(make_engine):
    views = make_engine(**FP8).runner.views
    assert views.buffer.dtype == torch.uint8 and views.swa[0].dtype == torch.uint8
    assert (views.main_codec.nope, views.main_codec.rope, views.main_codec.qblock) == (24, 8, 8)
    assert views.swa[0].shape[1] == 48 and views.comp[1].shape[1] == 48  # 24 + 16 + 3 scales -> 43, padded to 48
    assert views.index_codec.dim == 16 and views.index[1].shape[1] == 20
    assert views.csa[1].main_kv.dtype == torch.float32  # the boundary state stays fp32


def run_suite(engine, n_out):
    params = SamplingParams(max_tokens=n_out, temperature=0.0, ignore_eos=True)
    seqs = []
    for p in prompts():
        engine.add_request(p, params)
        seqs.append(engine.scheduler.waiting[-1])
    return seqs, run_recording_logits(engine)


@pytest.mark.slow
def test_fp8_rows_give_the_quant_sim_references_tokens_and_logits_at_every_step(make_engine, reference_quant):
    seqs, steps = run_suite(make_engine(num_chunks=200, **FP8), 6)
    for seq, p in zip(seqs, prompts()):
        assert seq.output_token_ids == reference_greedy(reference_quant, p, 6), f"prompt of {len(p)} tokens"
    full = {s.seq_id: reference_logits(reference_quant, s.token_ids[:-1]) for s in seqs}
    for sid, start, logits in steps:
        want = full[sid][start:start + logits.shape[0]]
        torch.testing.assert_close(logits, want, rtol=1e-4, atol=1e-4 * float(want.abs().max()))


@pytest.mark.slow
def test_under_preemption_fp8_rows_give_the_quant_sim_references_greedy_tokens(make_engine, reference_quant):
    """Tokens only: against the reference's logits this schedule drifts past 1e-4 with fp32 rows as well (the
    engine's HCA online accumulator rounds differently from the reference's batch softmax, and under quant_sim an
    HCA entry can land on the other side of an FP8 rounding step), which is the HCA path, not the row format."""
    engine = make_engine(num_chunks=4, **FP8)
    seqs, _ = run_suite(engine, 40)
    assert engine.scheduler.num_preemptions > 0
    for seq, p in zip(seqs, prompts()):
        assert seq.output_token_ids == reference_greedy(reference_quant, p, 40), f"prompt of {len(p)} tokens"


@pytest.mark.slow
@pytest.mark.parametrize("boundary", [16, 48])
def test_an_fp8_prefix_hit_continues_bit_identically_to_a_cold_run_split_at_the_boundary(make_engine, boundary):
    cold_seq, cold = run(make_engine(budget=boundary, **FP8), PROMPT)
    engine = make_engine(budget=boundary, **FP8)  # arena poisoned with 0xFF: NaN in every format
    run(engine, PROMPT[:boundary], SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
    hit_seq, hit = run(engine, PROMPT)
    assert hit_seq.num_cached_tokens == boundary and hit_seq.stats.reused == boundary
    assert hit_seq.output_token_ids == cold_seq.output_token_ids
    assert_bit_identical(after(cold, boundary), hit)


@pytest.mark.slow
def test_an_fp8_hit_served_from_a_chunk_the_compress_owner_held_before_is_still_exact(make_engine):
    boundary = 32
    cold_seq, cold = run(make_engine(budget=boundary, **FP8), PROMPT)
    engine = make_engine(budget=boundary, num_chunks=6, **FP8)
    bm = engine.scheduler.bm
    run(engine, [(11 * i) % 500 + 1 for i in range(400)], SamplingParams(max_tokens=2, temperature=0.0))
    compress_chunks = {bm.arena.chunk_of(COMPRESS, bm.comp.page(b)) for b in range(bm.comp.num_ids)
                       if bm.arena.is_backed(COMPRESS, b)}
    assert compress_chunks
    bm.reset_prefix_cache()  # those chunks return to the arena, still holding fp8 compressed rows
    run(engine, PROMPT[:boundary], SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
    engine.add_request(PROMPT, SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True))
    hit_seq = engine.scheduler.waiting[-1]
    batch = engine.scheduler.schedule()
    restore = batch.seqs[0].restore_page
    assert restore >= 0 and restore // bm.arena.pages_per_chunk("swa") in compress_chunks
    hit = []
    while True:
        out = engine.runner.execute(batch)
        hit.append((batch.seqs[0].start_pos, engine.runner.last_logits[hit_seq.seq_id]))
        engine.scheduler.postprocess(batch, out)
        engine.check_integrity()
        if not engine.has_unfinished_requests():
            break
        batch = engine.scheduler.schedule()
    assert hit_seq.num_cached_tokens == boundary
    assert hit_seq.output_token_ids == cold_seq.output_token_ids
    assert_bit_identical(after(cold, boundary), hit)
