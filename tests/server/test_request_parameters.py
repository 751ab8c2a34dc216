"""The "Request parameters" table of docs/serving.md against the request models: every declared field is in
the table and every row is a declared field, and every refused parameter sent with another value than the
accepted ones is a 400 naming it, through the server's own parsing and preparation (no HTTP)."""

import json
import re
from pathlib import Path

import pytest

from atom.builtin_model import BUILTIN_MODEL_NAME as MODEL
from atom.entrypoints.launch import load_engine
from atom.entrypoints.limits import ServerLimits
from atom.entrypoints.metrics import ServerMetrics
from atom.entrypoints.protocol import ApiError, ChatCompletionRequest, CompletionRequest, StreamOptions
from atom.entrypoints.request_parse import parse_body
from atom.entrypoints.serving import OpenAIServing
from support.server import small_config

DOC = Path(__file__).resolve().parents[2] / "docs" / "serving.md"
MODELS = {"completions": CompletionRequest, "chat": ChatCompletionRequest}
LIMITS = ServerLimits(max_prompt_chars=4096)
STATUSES = {"implemented", "refused", "no effect", "chat format"}

# a value each refused parameter does not accept (the chat's own value where it differs)
REFUSED_VALUES = {
    "stream_options.include_obfuscation": True, "stream_options.continuous_usage_stats": True,
    "spaces_between_special_tokens": True, "best_of": 2, "functions": [{"name": "f", "parameters": {}}],
    "suffix": "tail", "use_beam_search": True, "length_penalty": 0.8, "truncate_prompt_tokens": 5,
    "prompt_logprobs": 1, "allowed_token_ids": [65, 66], "bad_words": ["x"], "guided_json": {"type": "object"},
    "guided_regex": "[a-z]+", "guided_choice": ["yes", "no"], "guided_grammar": "root ::= \"a\"",
    "guided_decoding_backend": "xgrammar", "guided_whitespace_pattern": " ", "structured_outputs": {"regex": "a"},
    "logits_processors": ["mod.Proc"], "priority": 1, "request_id": "mine", "return_tokens_as_token_ids": True,
    "return_token_ids": True, "cache_salt": "salt", "kv_transfer_params": {"k": 1}, "vllm_xargs": {"a": 1},
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}], "tool_choice": "required",
    "response_format": {"type": "json_object"}, "prompt_embeds": "AAAA", "add_special_tokens": False,
    "audio": {"voice": "alloy", "format": "wav"}, "modalities": ["text", "audio"], "prediction":
        {"type": "content", "content": "x"}, "web_search_options": {}, "service_tier": "flex", "store": True,
    "metadata": {"k": "v"}, "verbosity": "low", "function_call": {"name": "f"}, "echo": True,
    "continue_final_message": True, "documents": [{"title": "t", "text": "x"}], "chat_template": "{{ x }}",
    "mm_processor_kwargs": {}, "structural_tag": "{}", "include_reasoning": False,
}
CHAT_REFUSED_VALUES = {"add_special_tokens": True}

# accepted values of refused and no-effect parameters: a request with them is prepared as usual
ACCEPTED = {
    "completions": {"best_of": 1, "suffix": "", "use_beam_search": False, "length_penalty": 1.0, "priority": 0,
                    "bad_words": [], "spaces_between_special_tokens": False, "add_special_tokens": True,
                    "tool_choice": "none", "response_format": {"type": "text"}, "user": "u-1",
                    "return_token_ids": False},
    "chat": {"store": False, "service_tier": "auto", "modalities": ["text"], "echo": False,
             "add_special_tokens": False, "include_reasoning": True, "function_call": "none",
             "prompt_cache_key": "k", "safety_identifier": "s", "user": "u"},
}


def table_rows():
    """``[(parameter, endpoint, status)]`` of the "Request parameters" table."""
    text = DOC.read_text(encoding="utf-8")
    section = text.split("### Request parameters", 1)[1]
    section = re.split(r"\n#{2,3} ", section, maxsplit=1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| `"):
            rows.append((cells[0].strip("`"), cells[1], cells[2]))
    return rows


def declared(model):
    names = set(model.model_fields)
    return names | {f"stream_options.{f}" for f in StreamOptions.model_fields}


def endpoints(where):
    return ["completions", "chat"] if where == "both" else [where]


def cases(status):
    return [(name, ep) for name, where, s in table_rows() if s == status for ep in endpoints(where)]


@pytest.fixture(scope="module")
def serving(model_dir):
    engine = load_engine(small_config(model_dir))  # never started: preparation does not reach its thread
    return OpenAIServing(engine, ServerMetrics(), LIMITS)


def prepare(serving, endpoint, extra):
    body = {"model": MODEL, "max_tokens": 4, **extra}
    body.update({"prompt": "hello"} if endpoint == "completions" else {"messages": [{"role": "user", "content": "hi"}]})
    req = parse_body(json.dumps(body).encode(), MODELS[endpoint], LIMITS, serving.engine.max_model_len)
    return (serving.prepare_completion if endpoint == "completions" else serving.prepare_chat)(req)


def with_value(name, value):
    if name.startswith("stream_options."):
        return {"stream": True, "stream_options": {name.split(".", 1)[1]: value}}
    return {name: value}


def test_the_table_lists_every_declared_field_of_each_endpoint_once_and_nothing_else():
    rows = table_rows()
    keys = [(name, ep) for name, where, _ in rows for ep in endpoints(where)]
    assert len(keys) == len(set(keys)), "a parameter is listed twice for one endpoint"
    assert {s for _, _, s in rows} <= STATUSES
    for ep, model in MODELS.items():
        assert {name for name, e in keys if e == ep} == declared(model), ep


def test_every_refused_parameter_of_the_table_has_a_value_to_send_here():
    assert {name for name, _ in cases("refused")} == set(REFUSED_VALUES)


@pytest.mark.parametrize("name,endpoint", cases("refused"))
def test_a_refused_parameter_with_another_value_is_a_400_naming_it(serving, name, endpoint):
    value = CHAT_REFUSED_VALUES.get(name, REFUSED_VALUES[name]) if endpoint == "chat" else REFUSED_VALUES[name]
    with pytest.raises(ApiError) as err:
        prepare(serving, endpoint, with_value(name, value))
    assert (err.value.status, err.value.param, err.value.code) == (400, name, "unsupported_parameter")
    assert err.value.message.startswith(f"{name} is not supported")


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_the_accepted_values_of_refused_and_no_effect_parameters_are_prepared_as_usual(serving, endpoint):
    for name, value in ACCEPTED[endpoint].items():
        prep = prepare(serving, endpoint, with_value(name, value))
        assert len(prep.params) == 1, name
    for name, ep in cases("no effect"):
        assert ep != endpoint or name in ACCEPTED[endpoint], f"no accepted value tried for {name}"


def test_the_refusal_says_what_is_accepted_and_never_echoes_the_value(serving):
    with pytest.raises(ApiError) as err:
        prepare(serving, "chat", {"service_tier": "x" * 10_000})
    assert err.value.message == ('service_tier is not supported by this server; leave it out or send "auto" '
                                 'or "default"')


def test_implemented_vllm_extras_reach_the_sampling_params(serving):
    prep = prepare(serving, "completions", {"min_p": 0.25, "include_stop_str_in_output": True,
                                            "skip_special_tokens": False, "stop": "x"})
    p = prep.params[0]
    assert (p.min_p, p.include_stop_str_in_output, p.skip_special_tokens, p.stop) == (0.25, True, False, ("x",))
    default = prepare(serving, "completions", {}).params[0]
    assert (default.min_p, default.include_stop_str_in_output, default.skip_special_tokens) == (0.0, False, True)


def test_top_k_minus_one_is_off_as_in_vllm_and_below_that_a_400(serving):
    assert prepare(serving, "completions", {"top_k": -1}).params[0].top_k == 0
    with pytest.raises(ApiError) as err:
        prepare(serving, "completions", {"top_k": -2})
    assert (err.value.status, err.value.param) == (400, "top_k")


def test_min_p_out_of_range_is_a_400_naming_it(serving):
    with pytest.raises(ApiError) as err:
        prepare(serving, "chat", {"min_p": 1.5})
    assert (err.value.status, err.value.param) == (400, "min_p")


def test_a_deepseek_v4_encoded_chat_refuses_to_show_its_markers(serving):
    with pytest.raises(ApiError) as err:
        prepare(serving, "chat", {"thinking": True, "skip_special_tokens": False})
    assert (err.value.status, err.value.param) == (400, "skip_special_tokens")
    assert prepare(serving, "chat", {"skip_special_tokens": False}).params[0].skip_special_tokens is False
