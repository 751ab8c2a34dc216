"""The OpenAI chat request -> DeepSeek-V4 prompt mapping (chat_prompt.py), through the request model: where
tools and response formats are declared, tool_choice, the thinking switches, reasoning_effort, the roles, and
the refusals (a 400 naming the parameter), plus the character count of everything that reaches the prompt."""

import json

import httpx
import pytest

from atom.builtin_model import BUILTIN_MODEL_NAME as MODEL
from atom.entrypoints.chat_prompt import ChatFormat, prompt_chars, render_chat_prompt
from atom.entrypoints.dsv4_encoding import REASONING_EFFORT_MAX_PREFIX, encode_messages
from atom.entrypoints.protocol import ApiError, ChatCompletionRequest
from atom.tokenizer import Tokenizer, write_builtin_tokenizer

BOS, EOS, U, A = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>"
# key order name, parameters, description, strict: the prompt keeps it, and keeps "strict"
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer", "minimum": 1.0}}},
    "description": "Weather of a city", "strict": True}}
WEATHER_LINE = ('{"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}, '
                '"days": {"type": "integer", "minimum": 1.0}}}, "description": "Weather of a city", "strict": true}')


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return Tokenizer.from_dir(write_builtin_tokenizer(tmp_path_factory.mktemp("tok")))


def request(messages, **fields):
    return ChatCompletionRequest.model_validate({"model": MODEL, "messages": messages, **fields})


def render(tok, messages, **fields):
    return render_chat_prompt(tok, request(messages, **fields))


def refusal(tok, messages, **fields):
    with pytest.raises(ApiError) as err:
        render(tok, messages, **fields)
    assert err.value.status == 400
    return err.value


USER = {"role": "user", "content": "Weather in Paris?"}


def test_tools_go_on_the_first_system_message_with_their_keys_in_the_order_sent(tok):
    text, fmt = render(tok, [{"role": "system", "content": "Be brief."}, USER], tools=[WEATHER])
    assert text == encode_messages([{"role": "system", "content": "Be brief.", "tools": [WEATHER]}, USER], "chat")
    assert text.startswith(f"{BOS}Be brief.\n\n## Tools\n\n") and f"\n\n{WEATHER_LINE}\n\n" in text
    assert text.endswith(f"tool calls.\n{U}Weather in Paris?{A}</think>")
    assert fmt == ChatFormat(thinking=False, tools=True)


def test_without_an_opening_system_message_the_tools_get_an_empty_one_at_the_start(tok):
    text, _ = render(tok, [USER, {"role": "assistant", "content": "x"}, {"role": "system", "content": "S"}, USER],
                     tools=[WEATHER])
    assert text.startswith(f"{BOS}\n\n## Tools\n\n") and text.count("## Tools") == 1
    assert f"{EOS}S{U}" in text  # the later system message keeps its place and gets no tools


@pytest.mark.parametrize("choice", [None, "auto"])
def test_tool_choice_auto_declares_the_tools(tok, choice):
    fields = {} if choice is None else {"tool_choice": choice}
    assert "## Tools" in render(tok, [USER], tools=[WEATHER], **fields)[0]


def test_tool_choice_none_leaves_the_tools_out_of_the_prompt(tok):
    text, fmt = render(tok, [USER], tools=[WEATHER], tool_choice="none")
    assert text == f"{BOS}{U}Weather in Paris?{A}</think>" and fmt == ChatFormat(thinking=False, tools=False)


@pytest.mark.parametrize("choice", ["required", {"type": "function", "function": {"name": "get_weather"}}])
def test_forcing_a_call_is_refused_naming_tool_choice(tok, choice):
    assert refusal(tok, [USER], tools=[WEATHER], tool_choice=choice).param == "tool_choice"


def test_a_tool_loop_with_reasoning_in_history_renders_as_the_format_says(tok):
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}
    history = [USER, {"role": "assistant", "content": "", "reasoning_content": "need data", "tool_calls": [call]},
               {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    text, fmt = render(tok, history, tools=[WEATHER], chat_template_kwargs={"thinking": True})
    assert text.endswith(
        f"{U}Weather in Paris?{A}<think>need data</think>\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n"
        "<｜DSML｜parameter name=\"city\" string=\"true\">Paris</｜DSML｜parameter>\n</｜DSML｜invoke>\n"
        f"</｜DSML｜tool_calls>{EOS}{U}<tool_result>sunny</tool_result>{A}<think>")
    assert fmt == ChatFormat(thinking=True, tools=True)


@pytest.mark.parametrize("switch", [{"chat_template_kwargs": {"thinking": True}},
                                    {"chat_template_kwargs": {"enable_thinking": True}},
                                    {"thinking": {"type": "enabled"}}, {"thinking": True}])
def test_each_thinking_switch_opens_the_think_block(tok, switch):
    assert render(tok, [USER], **switch) == (f"{BOS}{U}Weather in Paris?{A}<think>", ChatFormat(True, False))


def test_thinking_switched_off_closes_the_think_block(tok):
    assert render(tok, [USER], thinking={"type": "disabled"})[0] == f"{BOS}{U}Weather in Paris?{A}</think>"


@pytest.mark.parametrize("fields, param", [
    ({"thinking": {"type": "enabled", "budget_tokens": 512}}, "thinking.budget_tokens"),
    ({"chat_template_kwargs": {"thinking": "yes"}}, "chat_template_kwargs.thinking"),
    ({"chat_template_kwargs": {"tools_in_user": True}}, "chat_template_kwargs.tools_in_user"),
    ({"reasoning_effort": "low", "thinking": True}, "reasoning_effort"),
    ({"reasoning_effort": "medium", "thinking": True}, "reasoning_effort"),
    ({"reasoning_effort": "max"}, "reasoning_effort"),  # thinking mode is off
    ({"parallel_tool_calls": False}, "parallel_tool_calls"),
    ({"response_format": {"type": "grammar"}}, "response_format"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    ({"add_generation_prompt": False, "thinking": True}, "add_generation_prompt"),
])
def test_options_the_format_cannot_honour_are_refused_naming_them(tok, fields, param):
    assert refusal(tok, [USER], **fields).param == param


def test_reasoning_effort_max_writes_its_prefix_and_high_changes_nothing(tok):
    thinking = {"chat_template_kwargs": {"thinking": True}}
    assert render(tok, [USER], reasoning_effort="max", **thinking)[0] == (
        f"{BOS}{REASONING_EFFORT_MAX_PREFIX}{U}Weather in Paris?{A}<think>")
    assert render(tok, [USER], reasoning_effort="high", **thinking)[0] == f"{BOS}{U}Weather in Paris?{A}<think>"


def test_a_json_schema_response_format_is_declared_as_sent(tok):
    rf = {"type": "json_schema", "json_schema": {"name": "w", "schema": {"type": "object"}, "strict": True}}
    text, _ = render(tok, [{"role": "system", "content": "S"}, USER], response_format=rf)
    assert text == (f"{BOS}S\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n"
                    '{"type": "json_schema", "json_schema": {"name": "w", "schema": {"type": "object"}, '
                    f'"strict": true}}}}{U}Weather in Paris?{A}</think>')


def test_a_json_object_response_format_comes_after_the_tools_block(tok):
    text, _ = render(tok, [USER], tools=[WEATHER], response_format={"type": "json_object"})
    assert text.startswith(f"{BOS}\n\n## Tools\n\n") and text.endswith(
        "tool calls.\n\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n"
        f'{{"type": "json_object"}}{U}Weather in Paris?{A}</think>')


def test_a_text_response_format_keeps_a_plain_chat_on_the_checkpoint_template(tok):
    assert render(tok, [USER], response_format={"type": "text"}) == (f"{BOS}{U}Weather in Paris?{A}", None)


def test_the_developer_role_is_accepted_in_a_plain_chat_and_rendered_as_its_own_turn(tok):
    text, fmt = render(tok, [{"role": "developer", "content": "Answer in French."}, USER])
    assert text == f"{BOS}{U}Answer in French.{U}Weather in Paris?{A}</think>" and fmt == ChatFormat(False, False)


def test_a_latest_reminder_is_rendered_before_the_user_turn(tok):
    text, _ = render(tok, [{"role": "latest_reminder", "content": "Date: 2026-12-01"}, USER])
    assert text == f"{BOS}<｜latest_reminder｜>Date: 2026-12-01{U}Weather in Paris?{A}</think>"


def test_content_parts_are_joined_with_a_blank_line(tok):
    parts = [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]
    assert render(tok, [{"role": "user", "content": parts}], thinking=False)[0] == f"{BOS}{U}one\n\ntwo{A}</think>"


@pytest.mark.parametrize("message, param", [
    ({"role": "user", "content": "hi", "name": "ann"}, "messages[1].name"),
    ({"role": "wizard", "content": "hi"}, "messages[1].role"),
    ({"role": "tool", "content": "r"}, "messages[1].tool_call_id"),
    ({"role": "user", "content": "hi", "tool_call_id": "c"}, "messages[1].tool_call_id"),
    ({"role": "user", "content": "hi", "reasoning_content": "r"}, "messages[1].reasoning_content"),
    ({"role": "user", "content": None}, "messages[1].content"),
    ({"role": "developer", "content": ""}, "messages[1].content"),
])
def test_message_fields_the_format_cannot_carry_are_refused_naming_them(tok, message, param):
    assert refusal(tok, [{"role": "system", "content": "S"}, message]).param == param


def test_a_huge_value_is_cut_short_in_the_refusal(tok):
    err = refusal(tok, [{"role": "w" * 100_000, "content": "hi"}])
    assert err.message == f"messages[0].role {'w' * 40 + '...'!r} is not accepted; accepted: system, developer, user, " \
                          "assistant, tool, latest_reminder"


def deep_call_history(depth=5000):
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "[" * depth + "]" * depth}}
    return [USER, {"role": "assistant", "content": None, "tool_calls": [call]}, {"role": "tool", "content": "r",
                                                                                  "tool_call_id": "c1"}]


def test_arguments_nested_thousands_deep_are_a_value_error_naming_the_call(tok):
    with pytest.raises(ValueError, match=r"messages\[1\]\.tool_calls\[0\]\.function\.arguments is nested too deeply"):
        render(tok, deep_call_history())


def test_a_new_system_message_for_the_tools_keeps_the_message_numbers_of_errors(tok):
    with pytest.raises(ValueError, match=r"^messages\[1\]\.tool_calls\[0\]"):
        render(tok, deep_call_history(), tools=[WEATHER])


def test_prompt_chars_counts_every_string_the_mapping_puts_in_the_prompt():
    call = {"id": "c1", "type": "function", "function": {"name": "fn", "arguments": '{"a": 1}'}}
    req = request([{"role": "system", "content": "abc"},
                   {"role": "user", "content": [{"type": "text", "text": "x"}, {"type": "text", "text": "yz"}]},
                   {"role": "assistant", "content": "ok", "reasoning_content": "think", "tool_calls": [call]},
                   {"role": "tool", "tool_call_id": "c1", "content": "res"}],
                  tools=[WEATHER], response_format={"type": "json_object"})
    # 3 + (1 + 2 + 2) + 2 + 5 + (2 + 2 + 8) + (2 + 3) + the tool's JSON line + the response format's JSON
    assert prompt_chars(req) == 32 + len(WEATHER_LINE) + len('{"type": "json_object"}')


# ---- through the server: refusals are 400s naming the parameter, never 500s -------------------------------
def post(server, body):
    return httpx.post(f"{server.base_url}/chat/completions", json={"model": MODEL, "max_tokens": 1, **body},
                      timeout=60)


@pytest.mark.parametrize("body, param", [
    ({"messages": [USER], "tool_choice": "required", "tools": [WEATHER]}, "tool_choice"),
    ({"messages": [{"role": "user", "content": "hi", "name": "ann"}]}, "messages[0].name"),
    ({"messages": [USER], "reasoning_effort": "low", "thinking": True}, "reasoning_effort"),
    ({"messages": [USER], "thinking": {"type": "enabled", "budget_tokens": 100}}, "thinking.budget_tokens"),
])
def test_refusals_reach_the_client_as_400s_naming_the_parameter(server, body, param):
    r = post(server, body)
    assert r.status_code == 400 and r.json()["error"]["param"] == param


def test_an_image_part_in_a_user_message_is_a_400(server):
    parts = [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]
    r = post(server, {"messages": [{"role": "user", "content": parts}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"


def test_a_developer_message_in_a_plain_chat_is_served(server):
    r = post(server, {"messages": [{"role": "developer", "content": "Be brief."}, USER]})
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == len(
        f"Be brief.Weather in Paris?".encode()) + 5  # BOS, two User tokens, Assistant, </think>
