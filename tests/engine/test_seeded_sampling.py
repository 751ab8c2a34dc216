"""Seeded sampling does not depend on the batch: the sampler's counter-based draws give a seeded row the
same token alone or among 31 other rows of mixed parameters, and an engine gives a seeded request the
same tokens alone, in a batch of 32 and through a preemption. The batched logits edits equal the
per-row reference exactly."""

import pytest
import torch

from atom.model_executor.logits_processors import SequenceHistory, apply_batched_edits, apply_logits_processors
from atom.model_executor.sampler import Sampler
from atom.sampling_params import SamplingParams

SEEDED = SamplingParams(max_tokens=20, temperature=1.0, top_p=0.9, top_k=50, seed=7, ignore_eos=True)
VOCAB = 64


def mixed_params(i: int) -> SamplingParams:
    """The other requests of a batch: greedy, unseeded, penalties, logit_bias, logprobs, min-p, other seeds."""
    kinds = [dict(temperature=0.0), dict(temperature=0.8), dict(temperature=1.0, repetition_penalty=1.3),
             dict(temperature=0.7, logit_bias=((3, 5.0),), logprobs=2), dict(temperature=1.0, min_p=0.2),
             dict(temperature=1.2, top_k=5, seed=i), dict(temperature=0.0, frequency_penalty=0.5),
             dict(temperature=1.0, presence_penalty=1.0, top_p=0.5)]
    return SamplingParams(max_tokens=20, ignore_eos=True, **kinds[i % len(kinds)])


def test_a_seeded_row_draws_the_same_token_alone_and_among_31_rows_of_mixed_parameters():
    logits = torch.randn(32, VOCAB, generator=torch.Generator().manual_seed(1)) * 2
    sampler = Sampler(seed=5)
    for sid in range(1, 32):
        if mixed_params(sid).needs_history:
            sampler.begin(sid, (1, 2, 3), (4, 4), VOCAB, torch.device("cpu"))
    for position in range(40):
        alone = Sampler(seed=9).sample(logits[0], SEEDED, position)
        requests = [sampler.request(0, SEEDED, position)] + [sampler.request(s, mixed_params(s), position)
                                                             for s in range(1, 32)]
        batch = sampler.sample_all(logits, requests)
        assert batch.tokens[0] == alone
    drawn = {Sampler().sample(logits[0], SEEDED, position) for position in range(40)}
    assert len(drawn) > 3  # the positions draw different tokens


def test_batched_logits_edits_equal_the_per_row_reference_exactly():
    logits = torch.randn(8, VOCAB, generator=torch.Generator().manual_seed(2)) * 3
    sampler = Sampler(seed=0, eos_token_id=5)
    histories, requests = {}, []
    for sid in range(8):
        params = SamplingParams(max_tokens=20, min_tokens=2 if sid == 6 else 0, stop_token_ids=(9,),
                                **{k: v for k, v in vars(mixed_params(sid)).items()
                                   if k in ("repetition_penalty", "frequency_penalty", "presence_penalty",
                                            "logit_bias")})
        prompt, output = (sid, 7, 7, 11), (3,) if sid == 6 else (3, 3, 12 + sid)
        if params.needs_history:
            sampler.begin(sid, prompt, output, VOCAB, torch.device("cpu"))
            histories[sid] = SequenceHistory.of(prompt, output, VOCAB, torch.device("cpu"))
        requests.append(sampler.request(sid, params, 10))
    batch, rows = sampler.rows(requests, logits.device)  # the histories' ids cross with the rows
    edited = apply_batched_edits(logits, rows, batch, sampler._counts, sampler._seen)
    banned = (9, 5)
    for sid, r in enumerate(requests):
        ref = apply_logits_processors(logits[sid], r.params, histories.get(sid), banned)
        assert torch.equal(edited[sid], ref), sid
    assert requests[6].banned == banned and edited[6, 5] == float("-inf")


def seeded_tokens(engine, others: int) -> list[int]:
    prompts = [[(17 * i + 3) % 500 + 1 for i in range(40)]] + [[(13 * i + n) % 500 + 1 for i in range(30 + n % 9)]
                                                                 for n in range(others)]
    params = [SEEDED] + [mixed_params(n) for n in range(others)]
    return engine.generate(prompts, params, use_tqdm=False)[0].output_token_ids


@pytest.mark.slow
def test_a_seeded_request_gives_the_same_tokens_alone_in_a_batch_of_32_and_through_a_preemption(make_engine):
    alone = seeded_tokens(make_engine(budget=64, max_seqs=32), 0)
    crowded = seeded_tokens(make_engine(budget=256, max_seqs=32), 31)
    tight = make_engine(budget=64, max_seqs=32, num_chunks=12)
    squeezed = seeded_tokens(tight, 31)
    assert tight.scheduler.num_preemptions > 0
    assert len(alone) == 20 and crowded == alone and squeezed == alone
