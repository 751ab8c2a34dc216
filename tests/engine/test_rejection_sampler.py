"""The rejection sampler keeps the target distribution whatever the drafts (chi-square on a tiny
vocabulary with fixed seeds), greedy acceptance is an exact match, and seeded verification repeats."""

import torch

from atom.spec_decode.rejection_sampler import greedy_accept, rejection_sample
from atom.model_executor.sampler import Sampler
from atom.sampling_params import SamplingParams

VOCAB = 5
TRIALS = 6000


def chi_square_p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    stat = ((counts - expected) ** 2 / expected).sum()
    return float(torch.special.gammaincc(torch.tensor((len(probs) - 1) / 2), stat / 2))


def first_tokens(target: torch.Tensor, draft_probs: torch.Tensor | None, seed: int) -> torch.Tensor:
    """Counts of the first emitted token over TRIALS verifications of one draft drawn from ``draft_probs``
    (None: always token 0, a deterministic draft)."""
    gen = torch.Generator().manual_seed(seed)
    counts = torch.zeros(VOCAB)
    for _ in range(TRIALS):
        d = 0 if draft_probs is None else int(torch.multinomial(draft_probs[0], 1, generator=gen))
        accepted, token = rejection_sample(target, [d], draft_probs, [gen, gen])
        counts[d if accepted else token] += 1
    return counts


def test_rejection_sampling_emits_tokens_distributed_as_the_target_for_a_sampled_draft():
    target = torch.softmax(torch.tensor([[1.0, 0.2, -0.5, 2.0, 0.0]] * 2), dim=-1)
    draft = torch.softmax(torch.tensor([[0.0, 1.5, 0.3, -1.0, 0.7]]), dim=-1)
    counts = first_tokens(target, draft, seed=7)
    assert chi_square_p_value(counts, target[0]) > 0.01
    assert chi_square_p_value(counts, draft[0]) < 1e-6  # the test can tell the two apart


def test_rejection_sampling_emits_tokens_distributed_as_the_target_for_a_deterministic_draft():
    target = torch.softmax(torch.tensor([[0.3, 1.1, -0.2, 0.5, 0.9]] * 2), dim=-1)
    counts = first_tokens(target, None, seed=11)
    assert chi_square_p_value(counts, target[0]) > 0.01
    assert 0.9 * TRIALS * float(target[0, 0]) < counts[0] < 1.1 * TRIALS * float(target[0, 0])


def test_a_draft_the_target_rules_out_is_always_rejected_and_a_certain_one_always_accepted():
    target = torch.tensor([[0.0, 0.5, 0.5, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0, 0.0]])
    gens = [torch.Generator().manual_seed(0) for _ in range(2)]
    for _ in range(50):
        accepted, token = rejection_sample(target, [3], None, gens)
        assert accepted == 0 and token in (1, 2)
    certain = torch.tensor([[0.0, 1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 1.0, 0.0]])
    assert rejection_sample(certain, [1], None, gens) == (1, 3)


def test_greedy_acceptance_takes_the_longest_matching_prefix_then_the_targets_token():
    assert greedy_accept([4, 7, 9, 2], [4, 7, 9]) == (3, 2)
    assert greedy_accept([4, 7, 9, 2], [4, 8, 9]) == (1, 7)
    assert greedy_accept([4, 7], [5]) == (0, 4)


def test_seeded_verification_repeats_and_unseeded_shares_the_engine_generator():
    logits = torch.randn(4, 32, generator=torch.Generator().manual_seed(3))
    params = SamplingParams(max_tokens=8, temperature=0.8, top_k=20, seed=123)
    runs = {Sampler(seed=s).verify(logits, (5, 6, 7), params, position=40) for s in range(4)}
    assert len(runs) == 1
    other = {Sampler().verify(logits, (5, 6, 7), SamplingParams(max_tokens=8, temperature=0.8, top_k=20, seed=s), 40)
             for s in range(40)}
    assert len(other) > 1
