"""The DeepSeek-V4 answer through the server: a completion holding a DSML tool call comes back as OpenAI
``tool_calls`` (plain and streamed, finish_reason ``tool_calls``), reasoning as ``reasoning_content``, and no
DSML in any content; a malformed answer ends as a normal response. The model is the real built-in one; only
its token choices are scripted (the runner's sampler returns the tokens of a given completion), since a tiny
random model does not write tool calls by itself."""

import contextlib
import json
from concurrent.futures import ThreadPoolExecutor

import pytest

from atom.builtin_model import BUILTIN_MODEL_NAME as MODEL
from atom.model_executor.sampler import StepSamples
from support.dsv4_answers import D, invoke, param
from support.server import start_server

THINKING = {"chat_template_kwargs": {"thinking": True}}
CALL = "\n\n" + f"<{D}tool_calls>\n" + invoke("f", param("x", "1", string=False)) + f"\n</{D}tool_calls>"
ANSWER = "Need f.</think>Calling." + CALL  # the end-of-sentence token follows as a token


@pytest.fixture(scope="module")
def scripted_server(model_dir):
    srv = start_server(model_dir)
    yield srv
    srv.stop()


@contextlib.contextmanager
def answering(srv, text, end=True):
    """While inside, every request on ``srv`` generates the tokens of ``text`` (then end-of-sentence when
    ``end``), whatever the model's logits say."""
    tok = srv.engine.tokenizer
    script = tok.encode(text, add_special_tokens=False) + ([tok.token_to_id("<｜end▁of▁sentence｜>")] if end else [])
    sampler = srv.engine.call_sync(lambda e: e.runner.sampler)
    produced: dict[int, int] = {}

    def sample_all(logits, requests):
        out = []
        for r in requests:
            k = produced.get(r.seq_id, 0)
            produced[r.seq_id] = k + 1
            out.append(script[min(k, len(script) - 1)])
        return StepSamples(out, [0] * len(out), [None] * len(out))

    sampler.sample_all = sample_all
    try:
        yield len(script)
    finally:
        del sampler.sample_all


def _chat(srv, **kw):
    return srv.client().chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], **kw)


@pytest.fixture(scope="module")
def called(scripted_server):
    """The plain and the streamed response (its chunks) to a chat request answered by ``ANSWER``. The two
    requests run at once, so the engine decodes the scripted answer (182 tokens with the end of sentence) in one
    batch for both instead of once for each."""
    with answering(scripted_server, ANSWER) as num_tokens, ThreadPoolExecutor(2) as pool:
        plain = pool.submit(_chat, scripted_server, max_tokens=num_tokens + 5, extra_body=THINKING)
        streamed = pool.submit(lambda: list(_chat(scripted_server, max_tokens=num_tokens + 5, extra_body=THINKING,
                                                  stream=True)))
        return plain.result(), streamed.result()


def test_a_dsml_call_comes_back_as_tool_calls_with_reasoning_apart(called):
    r, _ = called
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert (choice.message.reasoning_content, choice.message.content) == ("Need f.", "Calling.")
    [call] = choice.message.tool_calls
    assert (call.type, call.function.name, call.function.arguments) == ("function", "f", '{"x": 1}')
    assert call.id.startswith("call_")


def test_a_streamed_dsml_call_arrives_as_tool_call_deltas_and_no_content_piece_holds_dsml(called):
    _, chunks = called
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    contents = [d.content for d in deltas if d.content]
    assert "".join(contents) == "Calling." and not [c for c in contents if "｜" in c or "think>" in c]
    assert "".join(getattr(d, "reasoning_content", None) or "" for d in deltas) == "Need f."
    calls = [c for d in deltas for c in d.tool_calls or []]
    assert [(c.index, c.type, c.function.name, c.function.arguments) for c in calls] == [(0, "function", "f",
                                                                                         '{"x": 1}')]
    assert calls[0].id.startswith("call_")
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"


@pytest.mark.slow  # each case generates the whole scripted answer (about 180 tokens): 6-7 s of CPU
@pytest.mark.parametrize("stream", [False, True])
def test_a_malformed_call_ends_as_content_with_its_markers_made_inert(scripted_server, stream):
    bad = "Checking.\n" + CALL.lstrip("\n")  # one newline before the block: not a call
    expected = "Checking.\n" + CALL.lstrip("\n").replace(D, "|DSML|")
    with answering(scripted_server, bad) as num_tokens:
        r = _chat(scripted_server, max_tokens=num_tokens + 5, stream=stream, extra_body={"chat_template_kwargs":
                                                                                           {"thinking": False}})
        if stream:
            chunks = list(r)
            content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
            finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
        else:
            content, finish = r.choices[0].message.content, r.choices[0].finish_reason
    assert (content, finish) == (expected, "stop")


def test_an_answer_cut_by_max_tokens_inside_the_call_finishes_with_length_and_no_call(scripted_server):
    with answering(scripted_server, ANSWER, end=False):
        r = _chat(scripted_server, max_tokens=30, extra_body=THINKING)
    choice = r.choices[0]
    assert choice.finish_reason == "length" and not choice.message.tool_calls
    text = json.dumps(choice.message.model_dump(), ensure_ascii=False)
    assert D not in text and "<think>" not in text and "</think>" not in text
