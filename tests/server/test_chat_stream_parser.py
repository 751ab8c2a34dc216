"""The streaming DeepSeek-V4 answer parser (``ChatOutputParser``): its pieces joined equal the one-shot
``parse_completion`` however the answer is cut (every example and case, one character at a time and in
random pieces), no piece of content or reasoning ever holds a control string, and an answer that leaves
the format ends as documented (the rest as content, control strings made inert)."""

import random
import re

import pytest

from atom.entrypoints.chat_output import ChatOutputParser, inert
from atom.entrypoints.dsv4_answer import ANSWER_ERRORS, CONTROL_STRINGS, parse_completion
from support.dsv4_answers import (BOS, CASES, D, EOS, START, WEATHER, WEATHER_CALL, block, invoke, load_example,
                                  param, reference_examples)


def stream(text, mode, sizes=None, ended=False):
    """Feed ``text`` in pieces of ``sizes`` (default: one piece), then finish. Returns the joined
    (reasoning, content, calls as the one-shot parser writes them), the parser's error and every delta."""
    parser = ChatOutputParser(thinking=mode == "thinking")
    deltas, at = [], 0
    for size in sizes or [len(text)]:
        deltas.append(parser.feed(text[at:at + size]))
        at += size
    assert at >= len(text)
    deltas.append(parser.finish(ended))
    calls = [{"type": c["type"], "function": c["function"]} for d in deltas for c in d.tool_calls]
    joined = ("".join(d.reasoning for d in deltas), "".join(d.content for d in deltas), calls)
    return joined, parser.error, deltas


def one_shot(text, mode):
    """``(joined fields, None)`` of a text that parses, ``(None, message)`` of one that does not."""
    try:
        out = parse_completion(text, mode)
    except ANSWER_ERRORS as exc:
        return None, str(exc)
    return (out["reasoning_content"], out["content"], out["tool_calls"]), None


def chunkings(text, seed):
    """Every cut into single characters, then random pieces of 1 to 9 characters (seeded)."""
    rng = random.Random(seed)
    yield [1] * len(text)
    for _ in range(12):
        sizes = []
        while sum(sizes) < len(text):
            sizes.append(rng.randint(1, 9))
        yield sizes


def assert_no_control_strings(deltas, joined):
    for piece in [d.content for d in deltas] + [d.reasoning for d in deltas] + list(joined[:2]):
        assert not [c for c in CONTROL_STRINGS if c in piece], piece


def check_streaming(text, mode):
    """The streamed result is the same for every chunking, equals the one-shot parse when the text
    parses (else carries its error), and never holds a control string; returns (joined, error)."""
    expected, error = one_shot(text, mode)
    reference, ref_error, deltas = stream(text, mode)
    assert ref_error == error
    if expected is not None:
        assert reference == expected
    assert_no_control_strings(deltas, reference)
    for sizes in chunkings(text, seed=len(text)):
        joined, piece_error, deltas = stream(text, mode, sizes)
        assert (joined, piece_error) == (reference, error)
        assert_no_control_strings(deltas, joined)
    if text.endswith(EOS):  # a server strips the end token and says the answer ended
        assert stream(text[:-len(EOS)], mode, ended=True)[:2] == (reference, error)
    return reference, error


@pytest.mark.parametrize("name", reference_examples())
def test_every_reference_example_streams_to_the_one_shot_parse_whatever_the_pieces(name):
    mode, text, expected = load_example(name)
    joined, error = check_streaming(text, mode)
    if "error" in expected:
        assert error == expected["error"]["message"]
    else:
        out = expected["output"]
        assert joined == (out["reasoning_content"], out["content"], out["tool_calls"]) and error is None


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_every_parser_case_streams_to_the_one_shot_parse_whatever_the_pieces(case):
    _, mode, text, _ = case
    check_streaming(text, mode)


FRAGMENTS = ["a", "b c", "\n", "\n\n", "<", "</", "<th", "ink>", "</think>", "<think>", EOS, BOS, "｜", D, START,
             ">\n", f"<{D}invoke", ' name="f">\n', f"</{D}invoke", f"<{D}parameter", ' name="k" string="true">v<',
             ' name="n" string="false">[1,2]<', f"/{D}parameter", f"</{D}tool_calls>", "<｜end", "▁of", "<｜DS",
             "ML｜"]


def test_random_answers_stream_like_the_one_shot_parse_and_never_release_a_control_string():
    rng = random.Random(7)
    outcomes = {"parsed": 0, "failed": 0}
    for _ in range(400):
        mode = rng.choice(["chat", "thinking"])
        parts = [rng.choice(FRAGMENTS) for _ in range(rng.randint(0, 8))]
        if mode == "thinking" and rng.random() < 0.6:
            parts.insert(rng.randint(0, len(parts)), "</think>")
        if rng.random() < 0.4:
            parts.append(block(WEATHER))
        if rng.random() < 0.6:
            parts.append(EOS)
        _, error = check_streaming("".join(parts), mode)
        outcomes["failed" if error else "parsed"] += 1
    assert outcomes["parsed"] >= 40 and outcomes["failed"] >= 40  # both paths exercised


# ---- holding back, and the end of the answer -------------------------------------------------------------
def test_a_possible_marker_start_is_held_until_the_next_piece_decides_it():
    parser = ChatOutputParser(thinking=True)
    assert parser.feed("step one </thi").reasoning == "step one "
    assert parser.feed("nk>Answer\n\n<｜DS").content == "Answer"
    held = parser.feed("ML｜tool_calls>\n")
    assert (held.reasoning, held.content, held.tool_calls) == ("", "", [])
    rest = parser.feed(invoke("f") + f"\n</{D}tool_calls>")
    assert not rest
    last = parser.finish(ended=True)
    assert [(c["index"], c["function"]) for c in last.tool_calls] == [(0, {"name": "f", "arguments": "{}"})]
    assert parser.error is None


def test_text_that_only_looked_like_a_marker_is_released_as_it_was_written():
    parser = ChatOutputParser(thinking=False)
    assert parser.feed("a <th").content == "a "
    assert parser.feed("ree").content == "<three"
    assert parser.feed("\n\n<").content == ""
    assert parser.finish(ended=False).content == "\n\n<"
    assert parser.error == "Invalid format: missing EOS token"


def test_stream_tool_calls_carry_an_index_a_unique_id_and_the_function():
    (_, content, _), error, deltas = stream(f"c{block(invoke('now'), WEATHER)}", "chat", [5] * 100, ended=True)
    calls = [c for d in deltas for c in d.tool_calls]
    assert content == "c" and error is None
    assert [(c["index"], c["type"], c["function"]["name"]) for c in calls] == [(0, "function", "now"),
                                                                                (1, "function", "get_weather")]
    assert all(re.fullmatch(r"call_[0-9a-f]{24}", c["id"]) for c in calls) and calls[0]["id"] != calls[1]["id"]
    assert calls[1]["function"]["arguments"] == WEATHER_CALL[1]


# ---- answers that leave the format ------------------------------------------------------------------------
@pytest.mark.parametrize("mode, text, ended, expected", [
    # cut while reasoning (max_tokens): everything stays reasoning, a held marker start included
    ("thinking", "still thinking <th", False, ("still thinking <th", "", [])),
    ("thinking", "The answer is 4.", True, ("The answer is 4.", "", [])),
    # cut in the content: the content as written
    ("chat", "The answer is 4.\n\n<｜DS", False, ("", "The answer is 4.\n\n<｜DS", [])),
    # a malformed or cut block: from its blank line on, content with the markers made inert
    ("chat", f"c{START}>\n<{D}invoke name=\"f\">\n<{D}param", False,
     ("", 'c\n\n<|DSML|tool_calls>\n<|DSML|invoke name="f">\n<|DSML|param', [])),
    ("chat", f"c\n<{D}tool_calls>\n{invoke('now')}\n</{D}tool_calls>", True,
     ("", "c\n<|DSML|tool_calls>\n<|DSML|invoke name=\"now\">\n\n</|DSML|invoke>\n</|DSML|tool_calls>", [])),
    ("chat", f"a{block(WEATHER)}then more", True,
     ("", "a\n\n<|DSML|tool_calls>\n" + WEATHER.replace(D, "|DSML|") + "\n</|DSML|tool_calls>then more", [])),
    # a control string in the reasoning or content: what came before stays, the rest is content
    ("thinking", f"r<think>s</think>a", True, ("r", "<think >s</think >a", [])),
    ("chat", f"a</think>b{EOS}c", False, ("", "a</think >b<|end▁of▁sentence|>c", [])),
    ("chat", f"x{BOS}y", True, ("", "x<|begin▁of▁sentence|>y", [])),
])
def test_an_answer_that_leaves_the_format_keeps_what_was_released_and_ends_as_inert_content(mode, text, ended,
                                                                                                 expected):
    joined, error, deltas = stream(text, mode, [1] * len(text), ended=ended)
    assert joined == expected and error is not None
    assert stream(text, mode, ended=ended)[:2] == (expected, error)
    assert error == one_shot(text + (EOS if ended else ""), mode)[1]


def test_inert_replaces_every_control_string_and_cannot_form_a_new_one():
    assert inert(f"{BOS}<think>a</think>{D}{EOS}b") == ("<|begin▁of▁sentence|><think >a</think >|DSML|"
                                                         "<|end▁of▁sentence|>b")
    assert inert(f"x{EOS}") == "x"  # the answer's closing token is dropped
    assert inert("<th<think>ink>") == "<th<think >ink>"
    assert inert("｜DS｜DSML｜ML｜") == "｜DS|DSML|ML｜"
