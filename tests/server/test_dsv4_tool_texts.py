"""DeepSeek-V4 prompt: the tools block, the response-format block and DSML tool calls with typed parameters,
as the specification states them (sections 9 to 11), and the errors of malformed or too deeply nested input."""

import json

import pytest

from atom.entrypoints.dsv4_encoding import encode_messages
from atom.entrypoints.dsv4_tools_block import TOOLS_BLOCK_TEMPLATE

BOS, EOS, U, A = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>"
D = "｜DSML｜"

# the block as the specification gives it, as a JSON string ("authoritative for whitespace")
SPEC_BLOCK = json.loads(
    r'''"## Tools\n\nYou have access to a set of tools to help answer the user's question. You can invoke tools by writing a \"<｜DSML｜tool_calls>\" block like the following:\n\n<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"$TOOL_NAME\">\n<｜DSML｜parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</｜DSML｜parameter>\n...\n</｜DSML｜invoke>\n<｜DSML｜invoke name=\"$TOOL_NAME2\">\n...\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>\n\nString parameters should be specified as is and set `string=\"true\"`. For all other types (numbers, booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\nIf thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside <think>...</think> BEFORE any tool calls or final response.\n\nOtherwise, output directly after </think> with tool calls or final response.\n\n### Available Tool Schemas\n\n{TOOL_SCHEMAS}\n\nYou MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n"''')

# the specification's schema-line example: input key order name, parameters, description, strict
RATE_TOOL_JSON = ('{"type": "function", "function": {"name": "get_exchange_rate", "parameters": {"type": "object", '
                  '"properties": {"base": {"type": "string", "description": "ISO 4217 code, e.g. EUR (€)"}, '
                  '"quote": {"type": "string"}, "amount": {"type": "number"}}, "required": ["base", "quote"]}, '
                  '"description": "Convert an amount between two currencies at today\'s rate.", "strict": true}}')
RATE_LINE = ('{"name": "get_exchange_rate", "parameters": {"type": "object", "properties": {"base": {"type": "string", '
             '"description": "ISO 4217 code, e.g. EUR (€)"}, "quote": {"type": "string"}, "amount": {"type": "number"}}, '
             '"required": ["base", "quote"]}, "description": "Convert an amount between two currencies at today\'s '
             'rate.", "strict": true}')


def system_with(tools, content="S", **kw):
    return {"role": "system", "content": content, "tools": tools, **kw}


def test_the_tools_block_is_the_specified_text():
    assert TOOLS_BLOCK_TEMPLATE == SPEC_BLOCK


def test_a_schema_line_is_the_function_object_as_sent_keys_and_order_kept():
    tool = json.loads(RATE_TOOL_JSON)
    text = encode_messages([system_with([tool]), {"role": "user", "content": "q"}], "chat")
    assert text == (f"{BOS}S\n\n" + SPEC_BLOCK.replace("{TOOL_SCHEMAS}", RATE_LINE) + f"{U}q{A}</think>")


def test_several_tools_are_one_line_each_in_order():
    tools = [{"type": "function", "function": {"name": n}} for n in ("b", "a")]
    text = encode_messages([system_with(tools)], "chat")
    assert '\n\n{"name": "b"}\n{"name": "a"}\n\nYou MUST strictly' in text


def test_schema_numbers_keep_the_requests_int_and_float_spelling_as_python_writes_them():
    tool = json.loads('{"type": "function", "function": {"name": "f", "minimum": 0.0, "maximum": 1e3, '
                      '"big": 12345678901234567890, "tiny": 1e-7, "neg": -0}}')
    assert ('{"name": "f", "minimum": 0.0, "maximum": 1000.0, "big": 12345678901234567890, "tiny": 1e-07, "neg": 0}'
            in encode_messages([system_with([tool])], "chat"))


def test_a_developer_message_declares_tools_and_a_response_format_after_its_text():
    dev = {"role": "developer", "content": "d", "tools": [{"type": "function", "function": {"name": "f"}}],
           "response_format": {"type": "json_object"}}
    assert encode_messages([dev], "chat") == (
        f"{BOS}{U}d\n\n" + SPEC_BLOCK.replace("{TOOL_SCHEMAS}", '{"name": "f"}')
        + "\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n"
        + f'{{"type": "json_object"}}{A}</think>')


def test_a_response_format_alone_follows_the_system_text_after_a_blank_line():
    assert encode_messages([{"role": "system", "content": "S", "response_format": {"b": [1, 2.5], "a": "é"}}], "chat") == (
        f'{BOS}S\n\n## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n'
        '{"b": [1, 2.5], "a": "é"}')


def test_each_declaring_message_renders_its_own_block_in_place():
    f = [{"type": "function", "function": {"name": "f"}}]
    text = encode_messages([system_with(f), {"role": "user", "content": "q"}, system_with(f, "T")], "chat")
    assert text.count("## Tools") == 2 and text.index(f"{U}q") < text.index("T\n\n## Tools")


def calls_prompt(*arguments):
    calls = [{"id": f"c{k}", "type": "function", "function": {"name": "f", "arguments": args}}
             for k, args in enumerate(arguments)]
    return encode_messages([{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": calls}],
                           "chat")


def dsml(*params):
    return (f"{BOS}{U}q{A}</think>\n\n<{D}tool_calls>\n<{D}invoke name=\"f\">\n" + "\n".join(params)
            + f"\n</{D}invoke>\n</{D}tool_calls>{EOS}")


def p(key, value, string):
    return f"<{D}parameter name=\"{key}\" string=\"{'true' if string else 'false'}\">{value}</{D}parameter>"


@pytest.mark.parametrize("arguments, params", [
    ("{}", []),
    ("", [p("arguments", "", True)]),
    ("title=Toner low", [p("arguments", "title=Toner low", True)]),
    ({"title": "x", "priority": 1}, [p("arguments", '{"title": "x", "priority": 1}', False)]),
    (None, [p("arguments", "null", False)]),
    (5, [p("arguments", "5", False)]),
    ('{"a": 1, "b": 2, "a": 3}', [p("a", "3", False), p("b", "2", False)]),
    ('{"s": "x\\ny \\u00e9 <&> \\"q\\" \\/"}', [p("s", 'x\ny é <&> "q" /', True)]),
    ('{"l": [1,2], "e": 1E2, "r": 2.50, "t": 1e-7, "inf": 1e400, "nan": NaN, "z": -0, "b": true, "n": null}',
     [p("l", "[1, 2]", False), p("e", "100.0", False), p("r", "2.5", False), p("t", "1e-07", False),
      p("inf", "Infinity", False), p("nan", "NaN", False), p("z", "0", False), p("b", "true", False),
      p("n", "null", False)]),
    ('{"o": {"k": "\\u001b\\t", "big": 12345678901234567890}}',
     [p("o", '{"k": "\\u001b\\t", "big": 12345678901234567890}', False)]),
    ('{"we\\"ird": "<｜DSML｜x>"}', [p('we"ird', "<｜DSML｜x>", True)]),
])
def test_call_arguments_become_typed_parameters_as_specified(arguments, params):
    assert calls_prompt(arguments) == dsml(*params)


def test_a_no_argument_call_leaves_a_blank_line_inside_the_invoke():
    assert f"<{D}invoke name=\"f\">\n\n</{D}invoke>" in calls_prompt("{}")


def test_several_calls_are_one_invoke_each_in_order():
    text = calls_prompt('{"a": "1"}', '{"b": 2}')
    assert f"{p('a', '1', True)}\n</{D}invoke>\n<{D}invoke name=\"f\">\n{p('b', '2', False)}" in text


def assistant_with(call):
    return [{"role": "user", "content": "q"}, {"role": "assistant", "content": "", "tool_calls": [call]}]


@pytest.mark.parametrize("call, error", [
    ({"type": "function", "function": {"arguments": "{}"}}, r"messages\[1\]\.tool_calls\[0\]\.function\.name is missing"),
    ({"type": "function"}, r"messages\[1\]\.tool_calls\[0\]\.function\.name is missing"),
    ({"type": "function", "function": {"name": "f"}}, r"messages\[1\]\.tool_calls\[0\]\.function\.arguments is missing"),
    ({"function": {"name": "f", "arguments": "[1]"}}, r"arguments must be a JSON object, got JSON list"),
    ({"function": {"name": "f", "arguments": "null"}}, r"arguments must be a JSON object, got JSON NoneType"),
    ({"function": {"name": "f", "arguments": "[" * 5000 + "]" * 5000}},
     r"^messages\[1\]\.tool_calls\[0\]\.function\.arguments is nested too deeply to be read as JSON$"),
])
def test_malformed_calls_are_value_errors_naming_the_call(call, error):
    with pytest.raises(ValueError, match=error):
        encode_messages(assistant_with(call), "chat")


def nested(depth):
    value = {}
    for _ in range(depth):
        value = {"x": value}
    return value


def test_object_arguments_too_deep_to_write_are_a_value_error():
    with pytest.raises(ValueError, match=r"^messages\[1\]\.tool_calls\[0\]\.function\.arguments value of 'arguments' "
                                         r"is nested too deeply to be written as JSON$"):
        encode_messages(assistant_with({"function": {"name": "f", "arguments": nested(100_000)}}), "chat")


@pytest.mark.parametrize("tools, error", [
    ([{"type": "function", "function": {"name": "f", "parameters": nested(100_000)}}],
     r"messages\[0\]\.tools\[0\]\.function is nested too deeply to be written as JSON"),
    ([{"type": "function"}], r"messages\[0\]\.tools\[0\] has no 'function' object"),
])
def test_bad_tool_declarations_are_value_errors_naming_the_tool(tools, error):
    with pytest.raises(ValueError, match=error):
        encode_messages([system_with(tools)], "chat")
