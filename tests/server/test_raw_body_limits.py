"""Size and count limits hold on the raw body, before validation, templating or tokenization: every
string that can reach a chat prompt counts against ``max_prompt_chars`` (tools schemas, call ids,
function names, message names, reasoning), ``logit_bias`` is refused by its entry count before any
per-entry work and its keys must be ASCII digits, and the default character limit follows
``max_model_len``."""

import argparse
import json
import time

import pytest

from atom.builtin_model import BUILTIN_MODEL_NAME as MODEL
from atom.entrypoints.args import add_serve_arguments, server_args_from
from atom.entrypoints.limits import ServerLimits
from atom.entrypoints.protocol import ApiError, ChatCompletionRequest, CompletionRequest
from atom.entrypoints.request_parse import parse_body

LIMITS = ServerLimits(max_prompt_chars=10_000)
BIG = "q" * 4_000_000


def _chat(**fields):
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], **fields}


def _refusal(body, model=ChatCompletionRequest, limits=LIMITS) -> ApiError:
    with pytest.raises(ApiError) as info:
        parse_body(json.dumps(body).encode(), model, limits)
    assert info.value.status == 400
    return info.value


def _assistant_call(call_id="c1", name="f", arguments="{}"):
    return {"role": "assistant", "content": None,
            "tool_calls": [{"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}]}


CHAT_FIELD_ATTACKS = {
    "tools schema": _chat(tools=[{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "properties": {"x": {"description": BIG}}}}}]),
    "tools schema key": _chat(tools=[{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "properties": {BIG: {"type": "string"}}}}}]),
    "tool_call_id": {"model": MODEL, "messages": [{"role": "user", "content": "hi"}, _assistant_call(),
                                                  {"role": "tool", "tool_call_id": BIG, "content": "ok"}]},
    "tool call id": {"model": MODEL, "messages": [{"role": "user", "content": "hi"}, _assistant_call(call_id=BIG)]},
    "function name": {"model": MODEL, "messages": [{"role": "user", "content": "hi"}, _assistant_call(name=BIG)]},
    "message name": {"model": MODEL, "messages": [{"role": "user", "content": "hi", "name": BIG}]},
    "reasoning_content": {"model": MODEL, "messages": [{"role": "assistant", "content": "a",
                                                         "reasoning_content": BIG}]},
    "content parts": {"model": MODEL, "messages": [{"role": "user", "content": [{"type": "text", "text": BIG}]}]},
    "response_format schema": _chat(response_format={"type": "json_schema", "json_schema": {
        "name": "r", "schema": {"type": "object", "description": BIG}}}),
    "numbers in a tools schema": _chat(tools=[{"type": "function", "function": {
        "name": "f", "parameters": {"type": "integer", "enum": list(range(1_000_000))}}}]),
}
PARAM = {"tools schema": "tools", "tools schema key": "tools", "response_format schema": "response_format",
         "numbers in a tools schema": "tools"}


@pytest.mark.parametrize("field", sorted(CHAT_FIELD_ATTACKS))
def test_a_4mb_string_in_any_chat_field_that_reaches_the_prompt_is_refused_on_the_raw_body(field):
    err = _refusal(CHAT_FIELD_ATTACKS[field])
    assert err.param == PARAM.get(field, "messages") and err.code == "context_length_exceeded"
    assert "10000 characters" in err.message


def test_the_strings_of_many_small_fields_add_up():
    messages = [{"role": "user", "content": "m", "name": "n" * 400} for _ in range(30)]  # 30 x 405 characters
    err = _refusal({"model": MODEL, "messages": messages})
    assert err.param == "messages"
    fits = [{"role": "user", "content": "m", "name": "n" * 400} for _ in range(20)]
    assert len(parse_body(json.dumps({"model": MODEL, "messages": fits}).encode(), ChatCompletionRequest,
                          LIMITS).messages) == 20


def test_a_text_prompt_over_the_limit_is_refused_before_validation():
    err = _refusal({"model": MODEL, "prompt": ["a" * 6000, "b" * 6000]}, CompletionRequest)
    assert err.param == "prompt" and err.code == "context_length_exceeded"


def test_token_id_prompts_count_no_characters_and_a_long_one_is_refused_by_max_model_len_first():
    ids = {"model": MODEL, "prompt": [[65] * 3000] * 4}  # 12,000 ids: no characters
    assert len(parse_body(json.dumps(ids).encode(), CompletionRequest, LIMITS, 4096).prompt) == 4
    with pytest.raises(ApiError) as info:
        parse_body(json.dumps({"model": MODEL, "prompt": [65] * 1_000_000}).encode(), CompletionRequest, LIMITS, 4096)
    assert info.value.code == "context_length_exceeded" and "1000000 tokens" in info.value.message


def test_the_default_prompt_character_limit_is_a_small_multiple_of_max_model_len():
    from atom.entrypoints.limits import PROMPT_CHARS_PER_TOKEN

    assert PROMPT_CHARS_PER_TOKEN == 8
    assert ServerLimits().for_model(4096).max_prompt_chars == 32_768
    assert ServerLimits(max_prompt_chars=100).for_model(4096).max_prompt_chars == 100
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    assert server_args_from(parser.parse_args([])).limits.max_prompt_chars == 8 * 4096
    assert server_args_from(parser.parse_args(["--max-model-len", "1000"])).limits.max_prompt_chars == 8000
    assert server_args_from(parser.parse_args(["--max-prompt-chars", "77"])).limits.max_prompt_chars == 77


@pytest.mark.parametrize("key", ["³", "¹²", "①", "٣", "1" * 5000, "", "-1", " 1", "1e3", "0x1"])
def test_a_logit_bias_key_that_is_not_ascii_digits_is_a_400_naming_logit_bias(key):
    err = _refusal(_chat(logit_bias={key: 1.0}))
    assert err.param == "logit_bias" and "ASCII decimal digits" in err.message
    assert len(err.message) < 300  # a 5,000-digit key is not echoed whole


def test_a_290000_entry_logit_bias_is_refused_by_its_count_before_any_per_entry_work():
    body = json.dumps(_chat(logit_bias={str(i): 1.0 for i in range(290_000)})).encode()
    err = _refusal_raw(body)
    assert err.param == "logit_bias" and "290000 entries" in err.message and "1024" in err.message
    # the refusal costs about one JSON decode, not a pass over the entries (validation, int() of each
    # key); the fastest of three runs of each, so that a busy machine does not decide
    runs = [(_time(lambda: _refusal_raw(body)), _time(lambda: json.loads(body))) for _ in range(3)]
    refusal, decode_only = min(r for r, _ in runs), min(d for _, d in runs)
    assert refusal < 2 * decode_only + 0.02


def _refusal_raw(body: bytes) -> ApiError:
    with pytest.raises(ApiError) as info:
        parse_body(body, ChatCompletionRequest, LIMITS)
    return info.value


def _time(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def test_a_logit_bias_at_the_entry_limit_with_digit_keys_is_accepted():
    req = parse_body(json.dumps(_chat(logit_bias={str(i): 1.0 for i in range(1024)})).encode(),
                     ChatCompletionRequest, LIMITS)
    assert len(req.logit_bias) == 1024


def test_stop_token_ids_over_their_count_limit_are_refused_before_validation():
    err = _refusal(_chat(stop_token_ids=list(range(1025))))
    assert err.param == "stop_token_ids" and "1025" in err.message and "1024" in err.message
    req = parse_body(json.dumps(_chat(stop_token_ids=list(range(1024)))).encode(), ChatCompletionRequest, LIMITS)
    assert len(req.stop_token_ids) == 1024
