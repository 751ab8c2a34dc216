"""logprobs, logit_bias, penalties, min_tokens and stop_token_ids through the ``openai`` client; parameters
the server does not implement are a 400 naming them."""

import openai
import pytest

from atom.builtin_model import BUILTIN_MODEL_NAME as MODEL

A, B, EOS = ord("A"), ord("B"), 257
GREEDY = dict(model=MODEL, temperature=0)


def test_completion_logprobs_give_each_tokens_logprob_and_the_top_alternatives(server):
    r = server.client().completions.create(prompt="log probs", max_tokens=6, logprobs=3,
                                           extra_body={"ignore_eos": True}, **GREEDY)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 6
    for value, top in zip(lp.token_logprobs, lp.top_logprobs):
        assert 1 <= len(top) <= 3 and value <= 0.0  # keyed by string: tokens sharing one are merged
        assert value == max(top.values())  # greedy: the sampled token is the most likely one
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:k]) for k in range(6)]


def test_chat_logprobs_stream_one_entry_per_token_with_bytes(server):
    c = server.client()
    chunks = list(c.chat.completions.create(messages=[{"role": "user", "content": "hi"}], max_tokens=5,
                                            logprobs=True, top_logprobs=2, stream=True,
                                            stream_options={"include_usage": True},
                                            extra_body={"ignore_eos": True}, **GREEDY))
    entries = [e for ch in chunks if ch.choices and ch.choices[0].logprobs for e in ch.choices[0].logprobs.content]
    assert len(entries) == 5 == chunks[-1].usage.completion_tokens
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert bytes(b for e in entries for b in e.bytes).decode("utf-8", "replace") == text
    assert all(len(e.top_logprobs) == 2 and e.top_logprobs[0].logprob == e.logprob for e in entries)


def test_a_large_logit_bias_forces_its_token_and_a_negative_one_forbids_it(server):
    c = server.client()
    r = c.completions.create(prompt="bias", max_tokens=6, logit_bias={str(A): 100},
                             extra_body={"ignore_eos": True}, **GREEDY)
    assert r.choices[0].text == "AAAAAA"

    def first_token(**kw):
        r = c.chat.completions.create(messages=[{"role": "user", "content": "bias"}], max_tokens=1, logprobs=True,
                                      extra_body={"ignore_eos": True}, **GREEDY, **kw)
        return r.choices[0].logprobs.content[0]

    free = first_token()
    banned = first_token(logit_bias={str(b): -100 for b in free.bytes})
    assert len(free.bytes) == 1 and banned.bytes != free.bytes
    assert banned.logprob < free.logprob  # the raw distribution: the banned one was the likeliest


def test_frequency_penalty_breaks_a_repetition_that_presence_penalty_does_not(server):
    c = server.client()

    def run(**penalty):
        return c.completions.create(prompt="repeat", max_tokens=12, logit_bias={str(A): 8},
                                    extra_body={"ignore_eos": True}, **GREEDY, **penalty).choices[0].text

    assert run() == "A" * 12
    assert run(presence_penalty=1.0) == "A" * 12  # subtracted once, whatever the count
    penalised = run(frequency_penalty=2.0)  # subtracted once per repetition: A stops winning
    assert penalised.startswith("AA") and penalised != "A" * 12


def test_min_tokens_holds_off_the_end_of_sequence_token_and_stop_token_ids_end_early(server):
    c = server.client()
    eager = dict(prompt="end", max_tokens=10, logit_bias={str(EOS): 100}, **GREEDY)
    assert c.completions.create(**eager).usage.completion_tokens == 1
    held = c.completions.create(**eager, extra_body={"min_tokens": 4})
    assert held.usage.completion_tokens == 5 and held.choices[0].finish_reason == "stop"
    r = c.completions.create(prompt="end", max_tokens=10, logit_bias={str(B): 100},
                             extra_body={"stop_token_ids": [B], "ignore_eos": True}, **GREEDY)
    assert r.usage.completion_tokens == 1 and r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == ""  # the token that stopped the request is not part of the text


def test_the_same_seed_with_penalties_gives_the_same_text(server):
    c = server.client()

    def sample():
        return c.completions.create(model=MODEL, prompt="seeded", max_tokens=10, temperature=1.0, seed=5,
                                    frequency_penalty=0.7, presence_penalty=0.3,
                                    extra_body={"ignore_eos": True, "repetition_penalty": 1.3}).choices[0].text

    assert sample() == sample()


@pytest.mark.parametrize("extra,param", [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}}, "response_format"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]}, "tools"),
    ({"best_of": 3}, "best_of"),
    ({"suffix": "tail"}, "suffix"),
    ({"logit_bias": {"abc": 1}}, "logit_bias"),
    ({"logit_bias": {"999999": 1}}, "logit_bias"),
    ({"presence_penalty": 3}, "presence_penalty"),
    ({"echo": True, "logprobs": 1}, "logprobs"),
])
def test_parameters_that_are_not_supported_or_out_of_range_are_a_400_naming_them(server, extra, param):
    with pytest.raises(openai.BadRequestError) as err:
        server.client().completions.create(model=MODEL, prompt="x", max_tokens=1, extra_body=extra)
    assert err.value.body["param"] == param
