"""DeepSeek-V4 chat: the reasoning / content / tool-call split (hand-written answers,
streamed piece by piece), and the same through the ``openai`` client."""

import json

import openai
import pytest

from atom.builtin_model import BUILTIN_MODEL_NAME as MODEL

BOS, EOS, U, A = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>"
D = "｜DSML｜"
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                            "parameters": {"type": "object",
                                                           "properties": {"city": {"type": "string"}}}}}


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
    # a second </think> leaves the format: the rest is content, its markers made inert
    assert msg.reasoning_content == "" and msg.content == "</think ></think >"
    chunks = list(_chat(server, stream=True, **forced))
    deltas = [ch.choices[0].delta for ch in chunks if ch.choices]
    assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) == ""
    assert "".join(d.content or "" for d in deltas) == "</think ></think >"
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
