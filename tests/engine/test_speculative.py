"""Speculative decoding verifies drafts in the target's forward and rolls rejected ones back without a
trace: greedy output with speculation on equals speculation off (chunked prefill, preemption, prefix
hits), an oracle draft is always accepted and an always-wrong one never, and compressor state after a
rejection equals a run that never drafted."""

import functools

import pytest
import torch

from atom.testing.replay_draft import ReplayDraft
from atom.sampling_params import SamplingParams

from .test_engine_vs_reference import prompts

N_OUT = 12


def greedy(n=N_OUT):
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)


def run(engine, prompt_list, params):
    """Step to completion (integrity checked each step); outputs in prompt order."""
    ids = [engine.add_request(p, params) for p in prompt_list]
    final = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                final[out.request_id] = out
        engine.check_integrity()
    return [final[i] for i in ids]


# arena chunks; with speculation on, chunks also hold the MTP layer's rows: 3 SWA pages per chunk, as the
# layout picks without it, keep the tight arena as tight
# the preempting arena runs the suite through many preemptions: 7-10 s a case on 2 cores, so it is slow
ARENAS = pytest.mark.parametrize("num_chunks", [200, pytest.param(5, marks=pytest.mark.slow)],
                                 ids=["roomy", "preempting"])


@pytest.fixture(scope="module")
def non_speculative(make_engine):
    """``num_chunks`` -> (the outputs with speculation off on that arena, the tokens each request generates):
    the oracle, wrong-draft and MTP-draft cases of an arena all compare against one such run, made once."""
    @functools.cache
    def off(num_chunks: int):
        n_out = N_OUT if num_chunks == 200 else 40
        return run(make_engine(num_chunks=num_chunks), prompts(), greedy(n_out)), n_out
    return off


@ARENAS
@pytest.mark.parametrize("k", [1, pytest.param(3, marks=pytest.mark.slow)])
def test_greedy_output_with_oracle_and_wrong_drafts_equals_the_non_speculative_run(make_engine, non_speculative,
                                                                                   num_chunks, k):
    off, n_out = non_speculative(num_chunks)
    reference = {tuple(p): o.output_token_ids for p, o in zip(prompts(), off)}
    oracle = make_engine(num_chunks=num_chunks, chunk_pages=3, speculative=k, drafter=ReplayDraft(reference))
    on = run(oracle, prompts(), greedy(n_out))
    assert [o.output_token_ids for o in on] == [o.output_token_ids for o in off]
    st = oracle.stats()
    assert st.spec_proposed > 0 and st.spec_accepted == st.spec_proposed
    wrong = make_engine(num_chunks=num_chunks, chunk_pages=3, speculative=k,
                        drafter=ReplayDraft(reference, shift=1, vocab_size=512))
    on = run(wrong, prompts(), greedy(n_out))
    assert [o.output_token_ids for o in on] == [o.output_token_ids for o in off]
    st = wrong.stats()
    assert st.spec_proposed > 0 and st.spec_accepted == 0
    if num_chunks == 5:
        assert oracle.scheduler.num_preemptions > 0 and wrong.scheduler.num_preemptions > 0


@pytest.mark.slow  # the suite twice on two engines: about 3.5 s of CPU
def test_the_second_round_of_the_suite_hits_the_prefix_cache_as_often_with_speculation_on(make_engine):
    params = greedy()
    off_engine = make_engine(budget=64)
    off = run(off_engine, prompts(), params) + run(off_engine, prompts(), params)
    reference = {tuple(p): o.output_token_ids for p, o in zip(prompts(), off)}
    on_engine = make_engine(budget=64, speculative=2, drafter=ReplayDraft(reference))
    on = run(on_engine, prompts(), params) + run(on_engine, prompts(), params)
    assert [o.output_token_ids for o in on] == [o.output_token_ids for o in off]
    assert [o.num_cached_tokens for o in on] == [o.num_cached_tokens for o in off]
    assert sum(o.num_cached_tokens for o in on[8:]) > 0
    assert on_engine.stats().prefix.reused == off_engine.stats().prefix.reused
    assert on_engine.stats().spec_accepted == on_engine.stats().spec_proposed > 0


def test_a_second_turn_reuses_as_many_tokens_with_speculation_on(make_engine):
    prompt = [(53 * i + 7) % 500 + 1 for i in range(40)]
    params = greedy(12)

    def two_turns(engine):
        first = run(engine, [prompt], params)[0]
        turn2 = prompt + first.output_token_ids + [9, 8, 7, 6, 5]
        return first, turn2, run(engine, [turn2], params)[0]

    first, turn2, second = two_turns(make_engine(budget=64))
    reference = {tuple(prompt): first.output_token_ids, tuple(turn2): second.output_token_ids}
    engine = make_engine(budget=64, speculative=3, drafter=ReplayDraft(reference))
    first_on, _, second_on = two_turns(engine)
    assert second.num_cached_tokens == 48
    assert (first_on.output_token_ids, second_on.output_token_ids) == (first.output_token_ids,
                                                                       second.output_token_ids)
    assert second_on.num_cached_tokens == second.num_cached_tokens


def _state_pages(engine, slot):
    """Every compressor-state tensor of ``slot`` (CSA rings of both compressors, HCA accumulators)."""
    v = engine.runner.views
    rows = [t[slot].clone() for layer in sorted(v.state) for t in (*v.state[layer], *v.index_state[layer])]
    return rows + [v.hca[layer][slot].clone() for layer in sorted(v.hca)]


@pytest.mark.slow  # three engines and 24 decode steps compared state by state: about 3.5 s of CPU
def test_compressor_state_after_rejected_drafts_equals_a_run_that_never_drafted(make_engine):
    """CSA rings (main and indexer) and HCA accumulators of a request whose every draft is rejected
    track those of the same request decoded one token per step."""
    prompt = prompts()[3]  # 33 tokens: decode crosses CSA entries and an HCA block end
    params = greedy(24)
    plain = make_engine(batch_invariant=True)
    (ref,) = run(plain, [prompt], params)
    wrong = make_engine(batch_invariant=True, speculative=3,
                        drafter=ReplayDraft({tuple(prompt): ref.output_token_ids}, shift=1, vocab_size=512))
    plain = make_engine(batch_invariant=True, overlap=False)  # its arena must hold this step's state, not the next's
    for engine in (plain, wrong):
        engine.add_request(prompt, params)
    compared = 0
    while wrong.has_unfinished_requests():
        wrong.step()
        plain.step()
        (seq_w,), (seq_p,) = wrong.scheduler.running or [None], plain.scheduler.running or [None]
        if seq_w is None:
            break
        slot_w = wrong.scheduler.bm.holdings[seq_w.seq_id].state_slot
        slot_p = plain.scheduler.bm.holdings[seq_p.seq_id].state_slot
        assert seq_w.num_computed_tokens == seq_p.num_computed_tokens  # slots differ: the layouts do (MTP rows)
        for a, b in zip(_state_pages(wrong, slot_w), _state_pages(plain, slot_p)):
            # not bit-exact: a step with drafts attends with wider (padded) index lists, whose reductions
            # round differently (~1e-7); a rejected draft's row left in the state would differ by O(1)
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        compared += 1
    assert compared >= 20 and wrong.stats().spec_proposed >= 3 * 20 and wrong.stats().spec_accepted == 0


def test_logits_of_accepted_positions_match_the_reference_model(make_engine, reference):
    from .test_engine_vs_reference import reference_logits

    off = run(make_engine(), prompts()[:5], greedy())
    drafts = ReplayDraft({tuple(p): o.output_token_ids for p, o in zip(prompts(), off)})
    engine = make_engine(speculative=3, drafter=drafts)
    seqs = []
    for p in prompts()[:5]:
        seqs.append(engine.sequence(engine.add_request(p, greedy())))
    steps = []
    while engine.has_unfinished_requests():
        step = engine.step_detailed()
        for item in step.batch.seqs:
            kept = item.num_committed + step.output.accepted.get(item.seq_id, 0)
            steps.append((item.seq_id, item.start_pos, step.output.logits[item.seq_id][:kept]))
        engine.check_integrity()
    assert sum(1 for s in engine.scheduler.spec.accepted_at if s) == 3
    full = {s.seq_id: reference_logits(reference, s.token_ids[:-1]) for s in seqs}
    for sid, start, logits in steps:
        want = full[sid][start:start + logits.shape[0]]
        torch.testing.assert_close(logits, want, rtol=1e-4, atol=1e-4 * float(want.abs().max()))


@ARENAS
def test_greedy_output_with_mtp_drafts_equals_the_non_speculative_run(make_engine, non_speculative, num_chunks):
    off, n_out = non_speculative(num_chunks)
    engine = make_engine(num_chunks=num_chunks, chunk_pages=3, speculative=2)
    on = run(engine, prompts(), greedy(n_out))
    assert [o.output_token_ids for o in on] == [o.output_token_ids for o in off]
    st = engine.stats()
    assert st.spec_verifies > 0 and st.spec_proposed > st.spec_verifies  # two drafts per step mostly
    assert engine.runner.views.layout.spec.num_mtp_layers == 1
    assert (engine.scheduler.num_preemptions > 0) == (num_chunks == 5)


def test_mtp_drafts_are_the_reference_mtp_layers_argmax(make_engine, reference):
    """With one draft per step every MTP row the engine reads was written from the main model's
    stream, so each draft equals the reference model's MTP prediction at that position."""
    prompt = prompts()[4]  # 70 tokens, prefilled in chunks of 37: the MTP rows span a chunk boundary
    engine = make_engine(speculative=1)
    seq = engine.sequence(engine.add_request(prompt, greedy(10)))
    proposed = []  # (computed tokens when proposed, draft)
    while engine.has_unfinished_requests():
        out = engine.step_detailed().output
        if seq.seq_id in out.drafts and not seq.status.finished:
            proposed.append((seq.num_computed_tokens, out.drafts[seq.seq_id][0]))
    toks = torch.tensor(seq.token_ids)
    cache = reference.new_cache(len(toks) + 1)
    hidden = reference.prefill(cache, toks[:-1]).hidden
    mtp = reference.mtp_extend(cache, hidden, toks[1:], 0)  # row q predicts token q + 2
    assert len(proposed) >= 5
    assert [d for _, d in proposed] == [int(mtp[c - 1].argmax()) for c, _ in proposed]


def test_the_benchmark_prints_acceptance_and_tokens_per_forward_for_each_draft_source(capsys):
    from atom.bench.speculative import main

    off, mtp, oracle = main(["--prompts", "1", "--max-tokens", "6", "--num-tokens", "2"])
    printed = capsys.readouterr().out
    assert printed.count("mean acceptance length") == 3 and printed.count("same tokens as off: True") == 2
    assert off.steps == 6 and off.tokens_per_forward == 1.0  # one prefill step, then one token per step
    # prefill (1 token), 2 drafts accepted (+ bonus: 3 tokens), 1 draft left within max_tokens (2 tokens)
    assert oracle.accepted == oracle.proposed == 3 and oracle.steps == 3 and oracle.tokens_per_forward == 2.0
    assert oracle.mean_acceptance_length == 2.5 and mtp.outputs == off.outputs


def test_seeded_sampling_with_mtp_drafts_repeats_exactly_and_verifies_drafts(make_engine):
    params = SamplingParams(max_tokens=10, temperature=0.9, top_k=40, seed=3, ignore_eos=True)
    runs = []
    for _ in range(2):
        engine = make_engine(speculative=2)
        runs.append([o.output_token_ids for o in run(engine, prompts()[:3], params)])
        assert engine.stats().spec_proposed > 0
    assert runs[0] == runs[1] and all(len(o) == 10 for o in runs[0])
