"""DeepSeek-V4 answer parser (``parse_completion``): the reference parser examples field for field (read from
the shared reference folder when it is there), this project's cases for every rule of the specification's
parser section, and the round trip of a parsed answer through the prompt encoder."""

import pytest

from atom.entrypoints.dsv4_answer import ANSWER_ERRORS, parse_completion
from atom.entrypoints.dsv4_encoding import encode_messages
from support.dsv4_answers import CASES, EOS, WEATHER, block, invoke, load_example, param, reference_examples


def _outcome(text, mode):
    try:
        return {"output": parse_completion(text, mode)}
    except ANSWER_ERRORS as exc:
        return {"error": {"type": type(exc).__name__, "message": str(exc)}}


@pytest.mark.parametrize("name", reference_examples())
def test_every_reference_parser_example_is_reproduced_field_for_field(name):
    mode, text, expected = load_example(name)
    assert _outcome(text, mode) == expected


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_each_rule_of_the_parser_gives_the_release_parsers_result(case):
    _, mode, text, expected = case
    assert _outcome(text, mode) == ({"error": expected} if set(expected) == {"type", "message"}
                                    else {"output": expected})


def test_the_output_has_the_release_keys_in_order_and_calls_have_no_id():
    out = parse_completion(f"r</think>c{block(WEATHER)}{EOS}", "thinking")
    assert list(out) == ["role", "content", "reasoning_content", "tool_calls"]
    assert list(out["tool_calls"][0]) == ["type", "function"]
    assert list(out["tool_calls"][0]["function"]) == ["name", "arguments"]


def test_an_unknown_thinking_mode_is_a_value_error_naming_the_accepted_ones():
    with pytest.raises(ValueError, match="thinking_mode must be 'chat' or 'thinking', got 'think'"):
        parse_completion(f"a{EOS}", "think")


def test_text_that_is_not_a_string_is_a_type_error():
    with pytest.raises(TypeError, match="text must be a str, got bytes"):
        parse_completion(b"a", "chat")



def test_a_block_of_many_invokes_gives_every_call_in_order():
    names = [f"f{i}" for i in range(3000)]
    out = parse_completion(block(*[invoke(n, param("i", str(i), string=False)) for i, n in enumerate(names)]) + EOS,
                           "chat")
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in out["tool_calls"]] == [
        (n, f'{{"i": {i}}}') for i, n in enumerate(names)]

# ---- round trip through the encoder ----------------------------------------------------------------------
TOOLS = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]


def _conversation(with_tools):
    system = {"role": "system", "content": "S", **({"tools": TOOLS} if with_tools else {})}
    return [system, {"role": "user", "content": "q"}]


def _history_message(parsed):
    """The parsed answer as a client sends it back (calls with ids, as the server returns them)."""
    calls = [{"id": f"call_{i}", **c} for i, c in enumerate(parsed["tool_calls"])]
    return {"role": "assistant", "content": parsed["content"], "reasoning_content": parsed["reasoning_content"],
            **({"tool_calls": calls} if calls else {})}


def _round_trip(mode, completion):
    """``(prompt, the re-encoded conversation with the parsed answer appended)``."""
    parsed = parse_completion(completion, mode)
    conversation = _conversation(bool(parsed["tool_calls"]))
    prompt = encode_messages(conversation, thinking_mode=mode)
    return prompt, encode_messages(conversation + [_history_message(parsed)], thinking_mode=mode)


def _parsing_examples():
    names = reference_examples()
    if names and not isinstance(names[0], str):
        return names
    return [n for n in names if "output" in load_example(n)[2]]


# What the encoder writes differently from the model, by the specification's round-trip rules: values
# re-serialised in canonical JSON, a string="false" value that is not JSON written as one "arguments"
# string, and the end token after a block restored. Every other example must come back byte for byte.
NORMALISED = {
    "p04_chat_text_and_two_calls": [('string="false">["hw","p1"]<', 'string="false">["hw", "p1"]<'),
                                    ('string="false">1E2<', 'string="false">100.0<')],
    "p05_invalid_json_nonstring": [(param("when", "tomorrow at 9", False),
                                    param("arguments", '{"when": tomorrow at 9}'))],
    "p07_tool_calls_without_eos": [("</｜DSML｜tool_calls>", f"</｜DSML｜tool_calls>{EOS}")],
}


@pytest.mark.parametrize("name", _parsing_examples())
def test_a_parsed_reference_answer_sent_back_re_encodes_to_the_prompt_and_completion(name):
    mode, completion, _ = load_example(name)
    prompt, re_encoded = _round_trip(mode, completion)
    for model_wrote, encoder_writes in NORMALISED.get(name, []):
        assert completion.count(model_wrote) == 1
        completion = completion.replace(model_wrote, encoder_writes)
    assert re_encoded == prompt + completion


@pytest.mark.parametrize("mode, completion", [
    ("thinking", f"why</think>because{EOS}"),
    ("thinking", f"</think>{EOS}"),
    ("chat", f"\n\nTwo:\n- a\n\n{EOS}"),
    ("thinking", f"r</think>Let me look.{block(WEATHER)}{EOS}"),
    ("chat", f"{block(invoke('now'), WEATHER)}{EOS}"),
    ("chat", "c\n" + block(invoke("t", param("s", 'x <b> "q" é'), param("n", '{"k": [1, 2.5, null]}', False))) + EOS),
])
def test_an_answer_in_the_encoders_own_layout_round_trips_byte_for_byte(mode, completion):
    prompt, re_encoded = _round_trip(mode, completion)
    assert re_encoded == prompt + completion
