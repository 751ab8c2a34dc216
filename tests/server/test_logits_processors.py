"""The logits edits and log-probabilities of the sampler, on hand-made logits (exact values)."""

import math

import pytest
import torch

from atom.model_executor.logits_processors import SequenceHistory, apply_logits_processors, token_logprobs
from atom.model_executor.sampler import Sampler
from atom.sampling_params import SamplingParams

LOGITS = torch.tensor([2.0, -1.0, 0.5, 3.0, -2.0])


def test_logit_bias_adds_to_the_named_tokens_only():
    out = apply_logits_processors(LOGITS, SamplingParams(logit_bias=((1, 5.0), (4, -100.0))), None, ())
    assert out.tolist() == [2.0, 4.0, 0.5, 3.0, -102.0]
    assert LOGITS.tolist() == [2.0, -1.0, 0.5, 3.0, -2.0]  # the input is not modified


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits_of_seen_tokens():
    history = SequenceHistory.of((0,), (1,), 5, torch.device("cpu"))
    out = apply_logits_processors(LOGITS, SamplingParams(repetition_penalty=2.0), history, ())
    assert out.tolist() == [1.0, -2.0, 0.5, 3.0, -2.0]


def test_frequency_counts_outputs_and_presence_counts_once_and_the_prompt_is_not_penalised():
    history = SequenceHistory.of((3, 3), (0, 0, 0, 2), 5, torch.device("cpu"))
    out = apply_logits_processors(LOGITS, SamplingParams(frequency_penalty=0.5, presence_penalty=1.0), history, ())
    assert out.tolist() == [2.0 - 1.5 - 1.0, -1.0, 0.5 - 0.5 - 1.0, 3.0, -2.0]


def test_min_tokens_bans_eos_and_stop_tokens_until_enough_were_generated():
    params = SamplingParams(min_tokens=2, max_tokens=4, stop_token_ids=(3,))
    history = SequenceHistory.of((1,), (2,), 5, torch.device("cpu"))
    out = apply_logits_processors(LOGITS, params, history, (3, 0))
    assert out[0] == -math.inf and out[3] == -math.inf and out[1] == -1.0
    history.generated(2)
    assert apply_logits_processors(LOGITS, params, history, (3, 0)).tolist() == LOGITS.tolist()


def test_logprobs_are_the_log_softmax_of_the_raw_logits_with_the_top_alternatives_best_first():
    chosen, top = token_logprobs(LOGITS, 2, 2)
    expected = torch.log_softmax(LOGITS, -1)
    assert chosen == float(expected[2])
    assert top == ((3, float(expected[3])), (0, float(expected[0])))


def test_the_sampler_keeps_history_until_released_and_min_tokens_holds_off_eos():
    sampler = Sampler(seed=0, eos_token_id=3)
    params = SamplingParams(min_tokens=2, max_tokens=5, temperature=0.0, logprobs=1)
    sampler.begin(7, (0, 1), (), 5, torch.device("cpu"))
    first = sampler.sample(LOGITS, params, 2, seq_id=7)
    second = sampler.sample(LOGITS, params, 3, seq_id=7)
    third = sampler.sample(LOGITS, params, 4, seq_id=7)
    assert (first, second, third) == (0, 0, 3)  # eos (3) is the argmax, banned for the first two
    lp = sampler.logprobs(LOGITS, params, first)
    assert lp.token_id == 0 and lp.top == ((3, float(torch.log_softmax(LOGITS, -1)[3])),)
    sampler.release([7])
    assert sampler.sample(LOGITS, params, 2, seq_id=7) == 3  # no history: nothing banned


@pytest.mark.parametrize("field,value", [("presence_penalty", 2.5), ("frequency_penalty", -3), ("repetition_penalty", 0),
                                         ("logit_bias", ((1, 101.0),)), ("logit_bias", ((-1, 1.0),)),
                                         ("min_tokens", 17), ("logprobs", 21), ("logprobs", True)])
def test_out_of_range_edits_are_value_errors_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**{field: value})
