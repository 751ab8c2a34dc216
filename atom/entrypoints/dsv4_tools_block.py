"""The DeepSeek-V4 prompt's tool texts: the tools block, the response-format block and DSML tool calls.

Three pieces of the prompt are built here (the message layout around them is in :mod:`dsv4_encoding`):

* the **tools block** a system or developer message gets when it declares ``tools``: a fixed text
  (:data:`TOOLS_BLOCK_TEMPLATE`) with one JSON line per tool, the tool's ``function`` object as given;
* the **response-format block** for a ``response_format`` value on such a message;
* the **DSML block** of an assistant turn's ``tool_calls``, one ``invoke`` per call and one
  ``parameter`` per argument, ``string="true"`` for a string argument (written raw) and
  ``string="false"`` for any other JSON value (written as JSON).

Every JSON text is Python's ``json.dumps(value, ensure_ascii=False)`` with its default separators, so
schemas keep their keys, key order and int / float spelling exactly as the request's JSON gave them.
Nothing is escaped: names, keys and string values go into the prompt as they are.
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

__all__ = ["DSML", "TOOL_CALLS_BEGIN", "TOOL_CALLS_END", "TOOLS_BLOCK_TEMPLATE", "RESPONSE_FORMAT_HEADER",
           "tools_block", "response_format_block", "tool_calls_block", "to_json"]

DSML = "｜DSML｜"
TOOL_CALLS_BEGIN, TOOL_CALLS_END = f"<{DSML}tool_calls>", f"</{DSML}tool_calls>"

#: The fixed text of the tools block; ``{TOOL_SCHEMAS}`` is replaced by the schema lines.
TOOLS_BLOCK_TEMPLATE = (
    "## Tools\n\n"
    "You have access to a set of tools to help answer the user's question. You can invoke tools by writing a "
    f"\"{TOOL_CALLS_BEGIN}\" block like the following:\n\n"
    f"{TOOL_CALLS_BEGIN}\n"
    f"<{DSML}invoke name=\"$TOOL_NAME\">\n"
    f"<{DSML}parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</{DSML}parameter>\n"
    "...\n"
    f"</{DSML}invoke>\n"
    f"<{DSML}invoke name=\"$TOOL_NAME2\">\n"
    "...\n"
    f"</{DSML}invoke>\n"
    f"{TOOL_CALLS_END}\n\n"
    "String parameters should be specified as is and set `string=\"true\"`. For all other types (numbers, "
    "booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n\n"
    "If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside "
    "<think>...</think> BEFORE any tool calls or final response.\n\n"
    "Otherwise, output directly after </think> with tool calls or final response.\n\n"
    "### Available Tool Schemas\n\n"
    "{TOOL_SCHEMAS}\n\n"
    "You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n"
)

RESPONSE_FORMAT_HEADER = "## Response Format:\n\nYou MUST strictly adhere to the following schema to reply:\n"


def to_json(value: Any, what: str) -> str:
    """``value`` as the format's JSON text; ``ValueError`` naming ``what`` when it is nested too deeply
    for the serializer (a ``RecursionError`` is never let through)."""
    try:
        return json.dumps(value, ensure_ascii=False)
    except RecursionError:
        raise ValueError(f"{what} is nested too deeply to be written as JSON") from None
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{what} cannot be written as JSON: {exc}") from None


def tools_block(tools: Sequence[Any], where: str) -> str:
    """The tools block of a non-empty ``tools`` list (OpenAI shape ``{"type": "function", "function":
    {...}}``; only ``function`` is written, as given). ``where`` names the list in errors."""
    lines = []
    for k, tool in enumerate(tools):
        if not isinstance(tool, Mapping) or "function" not in tool:
            raise ValueError(f"{where}[{k}] has no 'function' object; a tool is "
                             "{\"type\": \"function\", \"function\": {\"name\": ..., ...}}")
        lines.append(to_json(tool["function"], f"{where}[{k}].function"))
    return TOOLS_BLOCK_TEMPLATE.replace("{TOOL_SCHEMAS}", "\n".join(lines))


def response_format_block(response_format: Any, where: str) -> str:
    """The response-format block: the fixed header, then the value as JSON (nothing after it)."""
    return RESPONSE_FORMAT_HEADER + to_json(response_format, where)


def tool_calls_block(calls: Sequence[Any], where: str) -> str:
    """The DSML block of an assistant turn's non-empty ``tool_calls`` (without the leading ``"\\n\\n"``)."""
    invokes = [_invoke(call, f"{where}[{j}]") for j, call in enumerate(calls)]
    return TOOL_CALLS_BEGIN + "\n" + "\n".join(invokes) + "\n" + TOOL_CALLS_END


def _invoke(call: Any, where: str) -> str:
    fn = call.get("function") if isinstance(call, Mapping) else None
    if not isinstance(fn, Mapping) or fn.get("name") is None:
        raise ValueError(f"{where}.function.name is missing; a tool call is "
                         "{\"type\": \"function\", \"function\": {\"name\": ..., \"arguments\": \"<JSON>\"}}")
    if "arguments" not in fn:
        raise ValueError(f"{where}.function.arguments is missing (send \"{{}}\" for a call without arguments)")
    params = [_parameter(key, value, f"{where}.function.arguments")
              for key, value in _arguments(fn["arguments"], f"{where}.function.arguments").items()]
    return f"<{DSML}invoke name=\"{fn['name']}\">\n" + "\n".join(params) + f"\n</{DSML}invoke>"


def _arguments(raw: Any, where: str) -> dict[Any, Any]:
    """The parameters of a call: its arguments text parsed as JSON (Python's rules: duplicate keys keep
    the last value, ``1E2`` is a float). Anything that does not parse -- invalid JSON, an empty string,
    a value that is not a text -- becomes the one parameter ``arguments`` holding the raw value.
    Arguments that parse to a JSON value other than an object, or that are nested too deeply to parse,
    are a ``ValueError``."""
    try:
        parsed = json.loads(raw)
    except RecursionError:
        raise ValueError(f"{where} is nested too deeply to be read as JSON") from None
    except (TypeError, ValueError):
        return {"arguments": raw}
    if not isinstance(parsed, dict):
        raise ValueError(f"{where} must be a JSON object, got JSON {type(parsed).__name__} "
                         f"({_short(raw)})")
    return parsed


def _parameter(key: Any, value: Any, where: str) -> str:
    if isinstance(value, str):
        flag, text = "true", value
    else:
        flag, text = "false", to_json(value, f"{where} value of {_short(key)}")
    return f"<{DSML}parameter name=\"{key}\" string=\"{flag}\">{text}</{DSML}parameter>"


def _short(value: Any, limit: int = 60) -> str:
    text = value if isinstance(value, str) else repr(value)
    return repr(text if len(text) <= limit else text[:limit] + "...")
