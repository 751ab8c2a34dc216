"""A tool-calling conversation through the ``openai`` client: the answer's DSML block comes back as
``tool_calls``, and the conversation sent back with the tool's result reaches the engine as the prompt the
DeepSeek-V4 format specifies (read from the token ids the engine received). The built-in model's weights are
random, so its sampler is scripted to write a given answer."""

import json

import httpx
import pytest

from atom.builtin_model import BUILTIN_MODEL_NAME as MODEL
from atom.entrypoints.dsv4_encoding import encode_messages
from atom.model_engine.llm_engine import LLMEngine
from atom.model_executor.sampler import Sampler, StepSamples
from support.server import start_server

BOS, EOS, U, A = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>"
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
                                            "strict": True}}
CALL_TEXT = ("\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"get_weather\">\n"
             "<｜DSML｜parameter name=\"city\" string=\"true\">Paris</｜DSML｜parameter>\n"
             "<｜DSML｜parameter name=\"days\" string=\"false\">2</｜DSML｜parameter>\n"
             "</｜DSML｜invoke>\n</｜DSML｜tool_calls>")
# the tools block of the specification (section 9.1), written out here, with this request's one schema line
TOOLS_BLOCK = (
    "## Tools\n\nYou have access to a set of tools to help answer the user's question. You can invoke tools by "
    "writing a \"<｜DSML｜tool_calls>\" block like the following:\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke "
    "name=\"$TOOL_NAME\">\n<｜DSML｜parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE"
    "</｜DSML｜parameter>\n...\n</｜DSML｜invoke>\n<｜DSML｜invoke name=\"$TOOL_NAME2\">\n...\n</｜DSML｜invoke>\n"
    "</｜DSML｜tool_calls>\n\nString parameters should be specified as is and set `string=\"true\"`. For all other "
    "types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\n"
    "If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside "
    "<think>...</think> BEFORE any tool calls or final response.\n\nOtherwise, output directly after </think> "
    "with tool calls or final response.\n\n### Available Tool Schemas\n\n"
    '{"name": "get_weather", "description": "Weather of a city", "parameters": {"type": "object", "properties": '
    '{"city": {"type": "string"}}}, "strict": true}'
    "\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n")


@pytest.fixture(scope="module")
def long_server(model_dir):
    srv = start_server(model_dir, max_model_len=4096)
    yield srv
    srv.stop()


class Script:
    """Makes the engine's sampler write ``answer`` (then the end-of-sentence token) for every request, and
    records the prompt token ids each request reached the engine with."""

    def __init__(self, monkeypatch, tokenizer):
        self.tokenizer, self.answer_ids, self.prompts, self._written = tokenizer, [], [], {}
        script = self
        add_request = LLMEngine.add_request

        def sample_all(sampler, logits, requests):
            return StepSamples([script._next(r.seq_id) for r in requests], [0] * len(requests),
                               [None] * len(requests))

        def recording_add_request(engine, prompt, params, request_id=None, **placement):
            script.prompts.append(list(prompt))
            return add_request(engine, prompt, params, request_id, **placement)

        monkeypatch.setattr(Sampler, "sample_all", sample_all)
        monkeypatch.setattr(LLMEngine, "add_request", recording_add_request)

    def answer(self, text):
        self.answer_ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.tokenizer.eos_token_id]

    def _next(self, seq_id):
        k = self._written.get(seq_id, 0)
        self._written[seq_id] = k + 1
        return self.answer_ids[min(k, len(self.answer_ids) - 1)]

    def prompt_text(self, k):
        return self.tokenizer.decode(self.prompts[k], skip_special_tokens=False)


@pytest.mark.slow
def test_a_tool_call_and_its_result_sent_back_reach_the_engine_as_the_specified_prompt(long_server, monkeypatch):
    script = Script(monkeypatch, long_server.engine.tokenizer)
    client = long_server.client()
    messages = [{"role": "system", "content": "You report the weather."},
                {"role": "user", "content": "Weather in Paris?"}]
    script.answer("Let me check." + CALL_TEXT)
    first = client.chat.completions.create(model=MODEL, messages=messages, tools=[WEATHER], max_tokens=300,
                                           temperature=0)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = choice.message.tool_calls[0]
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", {"city": "Paris", "days": 2})
    declared = [{**messages[0], "tools": [WEATHER]}, messages[1]]
    assert script.prompt_text(0) == encode_messages(declared, "chat")

    script.answer("It is 18 °C and sunny.")
    history = messages + [choice.message.model_dump(exclude_none=True),
                          {"role": "tool", "tool_call_id": call.id, "content": '{"temp_c": 18}'}]
    second = client.chat.completions.create(model=MODEL, messages=history, tools=[WEATHER], max_tokens=300,
                                            temperature=0)
    assert second.choices[0].message.content == "It is 18 °C and sunny." and not second.choices[0].message.tool_calls
    expected = (f"{BOS}You report the weather.\n\n{TOOLS_BLOCK}{U}Weather in Paris?{A}</think>Let me check."
                f"{CALL_TEXT}{EOS}{U}<tool_result>{{\"temp_c\": 18}}</tool_result>{A}</think>")
    assert script.prompt_text(1) == expected
    # the first prompt and the answer the model wrote are the start of the second: the prefix cache can serve it
    assert expected.startswith(script.prompt_text(0) + "Let me check." + CALL_TEXT + EOS)
    assert expected == encode_messages(declared + [
        {"role": "assistant", "content": "Let me check.", "tool_calls": [
            {"id": call.id, "type": "function", "function": {"name": "get_weather",
                                                             "arguments": '{"city": "Paris", "days": 2}'}}]},
        {"role": "tool", "tool_call_id": call.id, "content": '{"temp_c": 18}'}], "chat")


def test_call_arguments_nested_thousands_deep_are_a_400_naming_the_call_not_a_500(long_server):
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "[" * 5000 + "]" * 5000}}
    body = {"model": MODEL, "max_tokens": 1, "messages": [
        {"role": "user", "content": "go"}, {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "r"}]}
    r = httpx.post(f"{long_server.base_url}/chat/completions", json=body, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["message"] == (
        "messages[1].tool_calls[0].function.arguments is nested too deeply to be read as JSON")
