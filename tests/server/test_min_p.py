"""``min_p``: the sampler drops tokens less likely than ``min_p`` times the most likely one (exact values on a
hand-made distribution), before ``top_p``, without reading anything back to the host."""

import math

import pytest
import torch

from atom.bench.op_count import OpCounter
from atom.model_executor.sampler import Sampler
from atom.sampling_params import SamplingParams

# softmax of these logits is exactly [1/2, 1/4, 1/8, 1/8] up to float rounding
LOGITS = torch.tensor([math.log(0.5), math.log(0.25), math.log(0.125), math.log(0.125)])


def probs(**kw):
    return Sampler.filtered_probs(LOGITS, SamplingParams(temperature=1.0, **kw)).tolist()


def test_min_p_keeps_the_tokens_at_least_that_fraction_of_the_most_likely_and_renormalises():
    assert probs(min_p=0.4) == pytest.approx([2 / 3, 1 / 3, 0.0, 0.0], abs=1e-7)  # threshold 0.2
    assert probs(min_p=0.2) == pytest.approx([0.5, 0.25, 0.125, 0.125], abs=1e-7)  # threshold 0.1: all kept
    assert probs(min_p=1.0) == pytest.approx([1.0, 0.0, 0.0, 0.0], abs=1e-7)  # only the most likely
    assert probs(min_p=0.0) == probs()  # 0 = off


def test_min_p_filters_before_top_p_takes_its_nucleus():
    assert probs(top_p=0.6) == pytest.approx([2 / 3, 1 / 3, 0.0, 0.0], abs=1e-7)
    # min_p first leaves [2/3, 1/3]; the most likely token alone then already exceeds 0.6
    assert probs(min_p=0.3, top_p=0.6) == pytest.approx([1.0, 0.0, 0.0, 0.0], abs=1e-7)


def test_a_seeded_min_p_sample_only_ever_draws_the_kept_tokens():
    sampler = Sampler(seed=0)
    params = SamplingParams(temperature=1.0, min_p=0.4, seed=11)
    drawn = {sampler.sample(LOGITS, params, position) for position in range(64)}
    assert drawn == {0, 1}


def test_the_filters_read_nothing_back_to_the_host():
    with OpCounter() as counter:
        Sampler.filtered_probs(LOGITS, SamplingParams(temperature=1.0, top_k=3, min_p=0.1, top_p=0.9))
    assert counter.syncs == 0


@pytest.mark.parametrize("value", [-0.1, 1.5, float("nan"), True, "0.5"])
def test_min_p_outside_zero_to_one_is_a_value_error_naming_it(value):
    with pytest.raises(ValueError, match="min_p"):
        SamplingParams(min_p=value)
