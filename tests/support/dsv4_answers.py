"""DeepSeek-V4 answers for the parser tests: the reference parser examples (read from the shared reference
folder beside the checkout when it is there) and this project's own cases, one or more per rule of the
specification's answer-parser section, each with the result the release's parser gives."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

EXAMPLES = Path(__file__).resolve().parents[2].parent / "shared" / "reference" / "dsv4_chat_examples"

BOS, EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
D = "｜DSML｜"
START = f"\n\n<{D}tool_calls"


def param(key: str, value: str, string: bool = True) -> str:
    return f'<{D}parameter name="{key}" string="{"true" if string else "false"}">{value}</{D}parameter>'


def invoke(name: str, *params: str) -> str:
    return f'<{D}invoke name="{name}">\n' + "\n".join(params) + f"\n</{D}invoke>"


def block(*invokes: str) -> str:
    return f"\n\n<{D}tool_calls>\n" + "\n".join(invokes) + f"\n</{D}tool_calls>"


def ok(content: str, reasoning: str = "", calls: tuple[tuple[str, str], ...] = ()) -> dict[str, Any]:
    """The parser's output for these fields (calls as (name, arguments text))."""
    return {"role": "assistant", "content": content, "reasoning_content": reasoning,
            "tool_calls": [{"type": "function", "function": {"name": n, "arguments": a}} for n, a in calls]}


def err(kind: str, message: str) -> dict[str, str]:
    return {"type": kind, "message": message}


WEATHER = invoke("get_weather", param("city", "Paris"), param("days", "[1, 2]", string=False))
WEATHER_CALL = ("get_weather", '{"city": "Paris", "days": [1, 2]}')
QUOTED_NAME = 'say "hi">'  # the name runs to the header's last '">'
RAW_STRING = 'A <b> "q" \\ é/\t\x1b\n2'  # quote, backslash, tab, escape and newline get JSON escapes; the rest stays
TAGS_VALUE = f'<{D}invoke name="x">' + "\n" + f"</{D}tool_calls>"

# (id, thinking_mode, completion text, expected output or error)
CASES: list[tuple[str, str, str, dict[str, Any]]] = [
    # structure: reasoning, content, end of sentence
    ("thinking answer", "thinking", f"why</think>because{EOS}", ok("because", "why")),
    ("chat answer keeps every newline", "chat", f"\n\nTwo:\n- a\n\n{EOS}", ok("\n\nTwo:\n- a\n\n")),
    ("only the end token", "chat", EOS, ok("")),
    ("only the end of thinking and the end token", "thinking", f"</think>{EOS}", ok("")),
    ("thinking without end of thinking", "thinking", f"still thinking{EOS}",
     err("AssertionError", "Invalid thinking format: missing </think>")),
    ("thinking text that just stops", "thinking", "still thinking <th",
     err("AssertionError", "Invalid thinking format: missing </think>")),
    ("a tool block before the end of thinking", "thinking", f"r{block(WEATHER)}{EOS}",
     err("AssertionError", "Invalid thinking format: missing </think>")),
    ("no end token", "chat", "The answer is 4.", err("AssertionError", "Invalid format: missing EOS token")),
    ("text after the end token", "chat", f"a{EOS}b", err("AssertionError", "Unexpected content at end")),
    ("a second end token", "chat", f"a{EOS}{EOS}", err("AssertionError", "Unexpected content at end")),
    # control strings inside content or reasoning
    ("end of thinking in chat content", "chat", f"a</think>b{EOS}",
     err("AssertionError", "Unexpected special token '</think>' in content")),
    ("a second end of thinking", "thinking", f"r</think>a</think>b{EOS}",
     err("AssertionError", "Unexpected special token '</think>' in content")),
    ("the prompt's think tag included", "thinking", f"<think>r</think>a{EOS}",
     err("AssertionError", "Unexpected special token '<think>' in content")),
    ("begin token in content", "chat", f"a{BOS}b{EOS}",
     err("AssertionError", f"Unexpected special token '{BOS}' in content")),
    ("end token inside reasoning", "thinking", f"r{EOS}more</think>a{EOS}",
     err("AssertionError", f"Unexpected special token '{EOS}' in content")),
    ("a lone DSML marker in reasoning", "thinking", f"r{D}</think>a{EOS}",
     err("AssertionError", f"Unexpected special token '{D}' in content")),
    ("a block after one newline", "chat", f"c\n<{D}tool_calls>\n{WEATHER}\n</{D}tool_calls>{EOS}",
     err("AssertionError", f"Unexpected special token '{D}' in content")),
    ("other special strings are text", "chat", f"<｜User｜><tool_result>x</tool_result><｜query｜>{EOS}",
     ok("<｜User｜><tool_result>x</tool_result><｜query｜>")),
    ("a marker prefix that is text", "chat", f"a </thin <｜end \n\n<｜DSM x{EOS}",
     ok("a </thin <｜end \n\n<｜DSM x")),
    # the tool-call block
    ("text then a call", "thinking", f"r</think>Let me look.{block(WEATHER)}{EOS}",
     ok("Let me look.", "r", (WEATHER_CALL,))),
    ("a call right after the end of thinking", "thinking", f"r</think>{block(WEATHER)}{EOS}",
     ok("", "r", (WEATHER_CALL,))),
    ("extra newlines stay in content", "chat", f"c\n{block(WEATHER)}{EOS}", ok("c\n", "", (WEATHER_CALL,))),
    ("two calls in order", "chat", f"{block(invoke('now'), WEATHER)}{EOS}",
     ok("", "", (("now", "{}"), WEATHER_CALL))),
    ("an empty block", "chat", f"c\n\n<{D}tool_calls>\n</{D}tool_calls>{EOS}", ok("c")),
    ("the block's start and nothing more", "chat", f"c{START}", ok("c")),
    ("no end token after a block", "chat", f"c{block(WEATHER)}", ok("c", "", (WEATHER_CALL,))),
    ("text after the block", "chat", f"c{block(WEATHER)}more{EOS}",
     err("AssertionError", "Unexpected content after tool calls")),
    ("text after the block's end token", "chat", f"c{block(WEATHER)}{EOS}more",
     err("AssertionError", "Unexpected content at end")),
    ("a space after the block tag", "chat", f"c{START} >\n{WEATHER}\n</{D}tool_calls>{EOS}",
     err("ValueError", "Tool call format error: expected '>\\n' but got ' >\n'")),
    ("a blank line between invokes", "chat", f"{START}>\n{WEATHER}\n\n{WEATHER}\n</{D}tool_calls>{EOS}",
     err("ValueError", "Tool call format error: expected '>\\n' but got '>\n\n'")),
    ("the block's tag and its newline only", "chat", f"c{START}>\n",
     err("ValueError", "Missing special token in tool calls")),
    ("no blank line before the block end", "chat", f"{START}>\n{WEATHER}</{D}tool_calls>{EOS}",
     err("ValueError", "Tool call format error: expected '>\\n' but got '>'")),
    # invoke headers
    ("no space before name", "chat", f'{START}>\n<{D}invoke{invoke("f")[len(f"<{D}invoke "):]}\n</{D}tool_calls>{EOS}',
     ok("", "", (("f", "{}"),))),
    ("spaces and a newline before name", "chat",
     f'{START}>\n<{D}invoke \n  name="f">\n</{D}invoke>\n</{D}tool_calls>{EOS}', ok("", "", (("f", "{}"),))),
    ("a name with quotes", "chat", block(invoke(QUOTED_NAME, param("k", "v"))) + EOS,
     ok("", "", ((QUOTED_NAME, '{"k": "v"}'),))),
    ("a header with one newline", "chat", f'{START}>\n<{D}invoke name="f">\n</{D}invoke>\n</{D}tool_calls>{EOS}',
     ok("", "", (("f", "{}"),))),
    ("a header with two blank lines", "chat",
     f'{START}>\n<{D}invoke name="f">\n\n\n</{D}invoke>\n</{D}tool_calls>{EOS}',
     err("ValueError", "Tool name format error: ' name=\"f\">\n\n\n'")),
    ("a header with single quotes", "chat", f"{START}>\n<{D}invoke name='f'>\n\n</{D}invoke>\n</{D}tool_calls>{EOS}",
     err("ValueError", "Tool name format error: ' name='f'>\n\n'")),
    ("a block cut after an invoke header", "chat", f'c{START}>\n<{D}invoke name="x">\n', ok("c", "", (("x", "{}"),))),
    ("a block cut inside an invoke", "chat", f'c{START}>\n<{D}invoke name="x">\n<{D}parameter name="k" str',
     err("ValueError", "Parameter format error: ' name=\"k\" str'")),
    # parameters
    ("string values are JSON-escaped", "chat", block(invoke("t", param("title", RAW_STRING))) + EOS,
     ok("", "", (("t", '{"title": "A <b> \\"q\\" \\\\ é/\\t\\u001b\\n2"}'),))),
    ("other values are copied as written", "chat",
     block(invoke("t", param("a", "[1,2]", False), param("b", "1E2", False), param("c", ' {"x":1} ', False))) + EOS,
     ok("", "", (("t", '{"a": [1,2], "b": 1E2, "c":  {"x":1} }'),))),
    ("a value that is not JSON is still copied", "chat", block(invoke("s", param("when", "at 9", False))) + EOS,
     ok("", "", (("s", '{"when": at 9}'),))),
    ("a value holding DSML tags and newlines", "chat", block(invoke("w", param("code", TAGS_VALUE))) + EOS,
     ok("", "", (("w", '{"code": "<｜DSML｜invoke name=\\"x\\">\\n</｜DSML｜tool_calls>"}'),))),
    ("a key with a quote", "chat", block(invoke("f", param('a"b', "v"))) + EOS,
     ok("", "", (("f", '{"a\\"b": "v"}'),))),
    ("a value ending in a newline before the close", "chat",
     f'{START}>\n<{D}invoke name="f">\n<{D}parameter name="k" string="true">v<\n/{D}parameter>\n'
     f"</{D}invoke>\n</{D}tool_calls>{EOS}", ok("", "", (("f", '{"k": "v"}'),))),
    ("two spaces before name", "chat", f'{START}>\n<{D}invoke name="f">\n<{D}parameter  name="k" string="true">v'
     f"</{D}parameter>\n</{D}invoke>\n</{D}tool_calls>{EOS}",
     err("ValueError", "Parameter format error: '  name=\"k\" string=\"true\">v<'")),
    ("a flag other than true or false", "chat", f'{block(invoke("f", param("k", "v").replace("true", "yes")))}{EOS}',
     err("ValueError", "Parameter format error: ' name=\"k\" string=\"yes\">v<'")),
    ("a space after a parameter", "chat", f'{START}>\n<{D}invoke name="f">\n{param("k", "v")} \n</{D}invoke>\n'
     f"</{D}tool_calls>{EOS}", err("ValueError", "Parameter format error: expected '>\\n' but got '> \n'")),
    ("a repeated parameter", "chat", f'{block(invoke("f", param("k", "1"), param("k", "2")))}{EOS}',
     err("ValueError", "Duplicate parameter name: 'k'")),
]


def reference_examples() -> list[Any]:
    """pytest params of the reference parser examples' names, or one skipped param saying where they were looked for."""
    if not EXAMPLES.is_dir():
        return [pytest.param(None, marks=pytest.mark.skip(reason=f"reference examples not found at {EXAMPLES}"))]
    return sorted(p.stem for p in EXAMPLES.glob("p[0-9][0-9]_*.json"))


def load_example(name: str) -> tuple[str, str, dict[str, Any]]:
    """``(thinking_mode, completion text, {"output": ...} or {"error": ...})`` of a reference example."""
    expected = json.loads((EXAMPLES / f"{name}.json").read_text(encoding="utf-8"))
    text = (EXAMPLES / f"{name}.txt").read_bytes().decode("utf-8")
    return expected.pop("thinking_mode"), text, expected
