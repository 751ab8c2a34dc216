"""The batched rejection sampler keeps the target distribution whatever the drafts (chi-square on a tiny
vocabulary, 6,000 verifications in one batch with counter-based uniforms), greedy acceptance is an exact
match, and seeded verification repeats."""

import torch

from atom.model_executor.counter_rng import hash32, uniforms
from atom.model_executor.sampler import Sampler
from atom.sampling_params import SamplingParams
from atom.spec_decode.rejection_sampler import first_rejection, row_outcomes

VOCAB = 5
TRIALS = 6000


def chi_square_p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    stat = ((counts - expected) ** 2 / expected).sum()
    return float(torch.special.gammaincc(torch.tensor((len(probs) - 1) / 2), stat / 2))


def first_tokens(target: torch.Tensor, draft_probs: torch.Tensor | None, salt: int) -> torch.Tensor:
    """Counts of the first emitted token over TRIALS verifications of one draft drawn from ``draft_probs``
    (None: always token 0, a deterministic draft); trial ``t`` owns rows ``2t`` (the draft) and ``2t + 1``."""
    keys = hash32(torch.arange(2 * TRIALS, dtype=torch.int64) + salt * 2 * TRIALS)
    noise = uniforms(keys, VOCAB + 1)
    if draft_probs is None:
        drafts = torch.zeros(TRIALS, dtype=torch.int64)
        q = None
    else:
        race = uniforms(hash32(keys[0::2] ^ 0x5BD1E995), VOCAB)
        drafts = torch.argmax(draft_probs[0] / -torch.log(race), dim=-1)
        q = draft_probs.repeat(2 * TRIALS, 1)
    draft = torch.stack([drafts, torch.full_like(drafts, -1)], dim=1).flatten()
    accepted, candidate = row_outcomes(target.repeat(TRIALS, 1), noise, draft, q)
    count, token = first_rejection(accepted, candidate, torch.arange(2 * TRIALS).view(TRIALS, 2))
    first = torch.where(count > 0, drafts, token)
    return torch.bincount(first, minlength=VOCAB).float()


def test_rejection_sampling_emits_tokens_distributed_as_the_target_for_a_sampled_draft():
    target = torch.softmax(torch.tensor([[1.0, 0.2, -0.5, 2.0, 0.0]] * 2), dim=-1)
    draft = torch.softmax(torch.tensor([[0.0, 1.5, 0.3, -1.0, 0.7]]), dim=-1)
    counts = first_tokens(target, draft, salt=7)
    assert chi_square_p_value(counts, target[0]) > 0.01
    assert chi_square_p_value(counts, draft[0]) < 1e-6  # the test can tell the two apart


def test_rejection_sampling_emits_tokens_distributed_as_the_target_for_a_deterministic_draft():
    target = torch.softmax(torch.tensor([[0.3, 1.1, -0.2, 0.5, 0.9]] * 2), dim=-1)
    counts = first_tokens(target, None, salt=11)
    assert chi_square_p_value(counts, target[0]) > 0.01
    assert 0.9 * TRIALS * float(target[0, 0]) < counts[0] < 1.1 * TRIALS * float(target[0, 0])


def test_a_draft_the_target_rules_out_is_always_rejected_and_a_certain_one_always_accepted():
    noise = uniforms(hash32(torch.arange(100, dtype=torch.int64)), VOCAB + 1)
    ruled_out = torch.tensor([[0.0, 0.5, 0.5, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0, 0.0]]).repeat(50, 1)
    draft = torch.tensor([3, -1]).repeat(50)
    count, token = first_rejection(*row_outcomes(ruled_out, noise, draft), torch.arange(100).view(50, 2))
    assert count.tolist() == [0] * 50 and set(token.tolist()) == {1, 2}
    certain = torch.tensor([[0.0, 1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0, 0.0]]).repeat(50, 1)
    count, token = first_rejection(*row_outcomes(certain, noise, torch.tensor([1, -1]).repeat(50)),
                                   torch.arange(100).view(50, 2))
    assert count.tolist() == [1] * 50 and token.tolist() == [3] * 50


def test_greedy_acceptance_takes_the_longest_matching_prefix_then_the_targets_token():
    def verify(argmaxes, drafts):
        logits = torch.nn.functional.one_hot(torch.tensor(argmaxes), 10).float()
        return Sampler().verify(logits, drafts, SamplingParams(temperature=0.0), position=0)
    assert verify([4, 7, 9, 2], (4, 7, 9)) == (3, 2)
    assert verify([4, 7, 9, 2], (4, 8, 9)) == (1, 7)
    assert verify([4, 7], (5,)) == (0, 4)


def test_requests_with_different_draft_counts_verify_in_one_batch_as_they_do_alone():
    logits = torch.randn(11, 32, generator=torch.Generator().manual_seed(5))
    greedy = SamplingParams(temperature=0.0)
    seeded = SamplingParams(temperature=0.9, top_p=0.8, seed=4)
    top = torch.argmax(logits, dim=-1).tolist()
    requests = [(greedy, (top[0], top[1], (top[2] + 1) % 32)), (seeded, (6,)), (greedy, ()), (seeded, (1, 2, 3))]
    sampler = Sampler()
    alone, first = [], 0
    for params, drafts in requests:
        alone.append(sampler.verify(logits[first:first + 1 + len(drafts)], drafts, params, position=30))
        first += 1 + len(drafts)
    batch = sampler.sample_all(logits, [sampler.request(i, p, 30, d) for i, (p, d) in enumerate(requests)])
    assert list(zip(batch.accepted, batch.tokens)) == alone
    assert alone[0] == (2, top[2]) and alone[2] == (0, top[6])


def test_seeded_verification_repeats_and_unseeded_shares_the_engine_generator():
    logits = torch.randn(4, 32, generator=torch.Generator().manual_seed(3))
    params = SamplingParams(max_tokens=8, temperature=0.8, top_k=20, seed=123)
    runs = {Sampler(seed=s).verify(logits, (5, 6, 7), params, position=40) for s in range(4)}
    assert len(runs) == 1
    other = {Sampler().verify(logits, (5, 6, 7), SamplingParams(max_tokens=8, temperature=0.8, top_k=20, seed=s), 40)
             for s in range(40)}
    assert len(other) > 1


def test_a_step_of_mixed_requests_with_drafts_samples_with_one_read_back_and_the_same_ops_at_any_values():
    from atom.bench.op_count import OpCounter

    def step(seed_shift: int) -> OpCounter:
        logits = torch.randn(9, 32, generator=torch.Generator().manual_seed(7 + seed_shift))
        sampler = Sampler(eos_token_id=2)
        sampler.begin(1, (3, 4), (5,), 32, torch.device("cpu"))
        kinds = [SamplingParams(temperature=0.0, logprobs=2),
                 SamplingParams(temperature=0.8, top_p=0.9, min_p=0.05, repetition_penalty=1.2 + seed_shift,
                                min_tokens=3, logit_bias=((4, 1.5),), seed=5 + seed_shift),
                 SamplingParams(temperature=1.0, top_k=4 + seed_shift, seed=9),
                 SamplingParams(temperature=0.0)]
        requests = [sampler.request(0, kinds[0], 10), sampler.request(1, kinds[1], 11),
                    sampler.request(2, kinds[2], 12, (1 + seed_shift, 2, 3)), sampler.request(3, kinds[3], 13, (4, 5))]
        with OpCounter() as counter:
            out = sampler.sample_all(logits, requests)
        assert len(out.tokens) == 4 and out.logprobs[0] is not None and len(out.logprobs[0].top) == 2
        return counter

    first, second = step(0), step(1)
    assert first.syncs == 1 and first.ops["tolist"] == 1  # the packed tokens / counts / logprobs
    assert first.ops == second.ops
