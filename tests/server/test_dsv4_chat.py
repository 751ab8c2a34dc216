"""DeepSeek-V4 chat: the reasoning / content / tool-call split (hand-written answers,
streamed piece by piece), and the same through the ``openai`` client."""

import json

import openai
import pytest

from atom.builtin_model import BUILTIN_MODEL_NAME as MODEL
from atom.entrypoints.chat_output import ChatOutputParser, parse_tool_calls

BOS, EOS, U, A = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>"
D = "｜DSML｜"
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                            "parameters": {"type": "object",
                                                           "properties": {"city": {"type": "string"}}}}}


ANSWER = (f"Check the weather.</think>Let me look.\n\n<{D}tool_calls>\n<{D}invoke name=\"get_weather\">\n"
          f"<{D}parameter name=\"city\" string=\"true\">Paris</{D}parameter>\n"
          f"<{D}parameter name=\"days\" string=\"false\">[1, 2]</{D}parameter>\n</{D}invoke>\n</{D}tool_calls>")


def _split(text, step, thinking=True, tools=True, markers_are_never_content=False):
    parser, reasoning, content, calls = ChatOutputParser(thinking, tools), [], [], []
    for i in range(0, len(text), step):
        d = parser.feed(text[i:i + step])
        reasoning.append(d.reasoning), content.append(d.content), calls.extend(d.tool_calls)
        if markers_are_never_content:
            assert "</think" not in d.content and D not in d.content
    d = parser.finish()
    reasoning.append(d.reasoning), content.append(d.content), calls.extend(d.tool_calls)
    return "".join(reasoning), "".join(content), calls


@pytest.mark.parametrize("step", [1, 2, 3, 7, 1000])
def test_a_thinking_answer_with_a_tool_call_splits_the_same_however_it_is_streamed(step):
    reasoning, content, calls = _split(ANSWER, step, markers_are_never_content=True)
    assert reasoning == "Check the weather." and content == "Let me look.\n\n"
    assert [(c["index"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [
        (0, "get_weather", {"city": "Paris", "days": [1, 2]})]
    assert calls[0]["type"] == "function" and calls[0]["id"].startswith("call_")


def test_without_thinking_everything_is_content_and_a_stray_end_marker_is_text():
    assert _split("a</think>b", 2, thinking=False, tools=False) == ("", "a</think>b", [])


def test_an_unfinished_or_malformed_tool_block_comes_back_as_content():
    cut = ANSWER[: ANSWER.index("</｜DSML｜invoke>")]
    assert _split(cut, 5)[1] == "Let me look.\n\n" + cut[cut.index(f"<{D}tool_calls>"):]
    bad = f"x<{D}tool_calls>not dsml</{D}tool_calls>"
    assert _split(bad, 4, thinking=False) == ("", bad, [])
    assert parse_tool_calls(f"<{D}invoke name=\"f\"><{D}parameter name=\"a\" string=\"false\">{{oops"
                            f"</{D}parameter></{D}invoke>") is None


def test_a_reasoning_answer_that_never_closes_is_all_reasoning():
    assert _split("still thinking <th", 3, tools=False) == ("still thinking <th", "", [])


# ---- through the server ------------------------------------------------------------------------------------
END_THINK_ID = 262  # "</think>" in the built-in tokenizer


def _chat(server, **kw):
    return server.client().chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                                   temperature=0, **kw)


def test_thinking_mode_returns_reasoning_content_apart_from_content_streamed_or_not(server):
    forced = dict(max_tokens=3, logit_bias={str(END_THINK_ID): 100},
                  extra_body={"chat_template_kwargs": {"thinking": True}, "ignore_eos": True})
    r = _chat(server, **forced)
    msg = r.choices[0].message
    assert msg.reasoning_content == "" and msg.content == "</think></think>"
    chunks = list(_chat(server, stream=True, **forced))
    deltas = [ch.choices[0].delta for ch in chunks if ch.choices]
    assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) == ""
    assert "".join(d.content or "" for d in deltas) == "</think></think>"
    free = _chat(server, max_tokens=4, extra_body={"thinking": {"type": "enabled"}, "ignore_eos": True})
    assert free.choices[0].message.content == "" and free.choices[0].message.reasoning_content is not None


def test_thinking_disabled_puts_everything_in_content_and_tools_reach_the_prompt(server):
    off = _chat(server, max_tokens=4, extra_body={"thinking": {"type": "disabled"}, "ignore_eos": True})
    plain = _chat(server, max_tokens=4, extra_body={"ignore_eos": True})
    assert off.usage.prompt_tokens == plain.usage.prompt_tokens + 1  # + the closing "</think>"
    assert getattr(off.choices[0].message, "reasoning_content", None) is None
    with pytest.raises(openai.BadRequestError) as err:  # the tools block does not fit this small server
        _chat(server, max_tokens=2, tools=[WEATHER], extra_body={"ignore_eos": True})
    assert err.value.body["code"] == "context_length_exceeded"
    tokens = int(err.value.body["message"].split(" has ")[1].split()[0])
    assert tokens > off.usage.prompt_tokens + len(json.dumps(WEATHER["function"]))


def test_a_streamed_choice_sends_tool_calls_as_deltas_and_finishes_with_reason_tool_calls():
    from atom.entrypoints.serving import _ChoiceState

    st = _ChoiceState(prompt_index=0, parser=ChatOutputParser(thinking=True, tools=True))
    deltas = [st.chat_delta(ANSWER[i:i + 9], finished=False) for i in range(0, len(ANSWER), 9)]
    st.finish_reason = "stop"
    deltas.append(st.chat_delta("", finished=True))
    calls = [c for d in deltas for c in d.get("tool_calls", [])]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == "Check the weather."
    assert len(calls) == 1 and calls[0]["index"] == 0 and st.chat_finish_reason() == "tool_calls"
