"""DeepSeek-V4 chat prompts: thinking and non-thinking modes, tool definitions, tool calls in history.

The layout follows the encoding DeepSeek publishes with the V4 release (its ``encoding`` notes);
this is an independent implementation of it::

    <｜begin▁of▁sentence｜>{system}{tools block}
    <｜User｜>{user}<｜Assistant｜></think>{answer}{tool calls}<｜end▁of▁sentence｜>    (an earlier turn)
    <｜User｜>{user}<｜Assistant｜><think>                                           (thinking mode)
    <｜User｜>{user}<｜Assistant｜></think>                                          (non-thinking mode)

* Thinking mode opens ``<think>`` for the model to reason in; it closes it with ``</think>`` and then
  answers. Non-thinking mode closes the block at once. Reasoning of earlier turns is dropped, except
  for assistant turns after the last user message (a tool-call loop in progress), whose
  ``reasoning_content`` is kept inside ``<think>...</think>`` as the model needs it to continue.
* Tools are described in a block appended to the system prompt (their JSON schemas one per line, and
  how to call them). A call is written in DSML::

      <｜DSML｜tool_calls>
      <｜DSML｜invoke name="get_weather">
      <｜DSML｜parameter name="city" string="true">Paris</｜DSML｜parameter>
      <｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>
      </｜DSML｜invoke>
      </｜DSML｜tool_calls>

  ``string="true"``: the value is the raw string; ``"false"``: it is JSON (numbers, booleans, arrays,
  objects). :mod:`chat_output` parses this back into OpenAI ``tool_calls``.
* Tool results (``role: "tool"``) follow in the next user turn as a ``function_results`` block with one
  ``result`` per call (this block's exact wording is this project's rendering of the release's tool
  turn; check it against the release's reference encoder before serving a real checkpoint).
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

__all__ = ["render_dsv4_chat", "DSML", "THINK", "END_THINK", "TOOL_CALLS_BEGIN", "TOOL_CALLS_END"]

BOS, EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
USER, ASSISTANT = "<｜User｜>", "<｜Assistant｜>"
THINK, END_THINK = "<think>", "</think>"
DSML = "｜DSML｜"
TOOL_CALLS_BEGIN, TOOL_CALLS_END = f"<{DSML}tool_calls>", f"</{DSML}tool_calls>"

_TOOLS_INTRO = (
    "## Tools\n"
    "You can call the tools below. To call one or more, write a block of this form:\n"
    f"{TOOL_CALLS_BEGIN}\n<{DSML}invoke name=\"TOOL_NAME\">\n"
    f"<{DSML}parameter name=\"PARAMETER_NAME\" string=\"true|false\">VALUE</{DSML}parameter>\n"
    f"</{DSML}invoke>\n{TOOL_CALLS_END}\n"
    "Use string=\"true\" for a string value written as is, and string=\"false\" for any other type, "
    "written as JSON.\n"
    "In thinking mode, finish your reasoning inside <think>...</think> before calling tools or answering.\n"
    "### Tool schemas\n"
)


def render_dsv4_chat(messages: Sequence[Mapping[str, Any]], *, thinking: bool,
                     tools: Sequence[Mapping[str, Any]] = (), add_generation_prompt: bool = True) -> str:
    """The prompt text of ``messages`` (OpenAI chat messages, already validated)."""
    system = "".join(_text(m) for m in messages if m["role"] in ("system", "developer"))
    parts = [BOS, system]
    if tools:
        parts.append(("\n\n" if system else "") + _TOOLS_INTRO
                     + "\n".join(json.dumps(_function(t), ensure_ascii=False) for t in tools))
    last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=-1)
    pending_results: list[Mapping[str, Any]] = []
    for i, m in enumerate(messages):
        role = m["role"]
        if role != "tool" and pending_results:
            parts.append(_results(pending_results))
            pending_results = []
        if role == "user":
            parts.append(USER + _text(m))
        elif role == "assistant":
            keep_reasoning = thinking and i > last_user and m.get("reasoning_content")
            opening = f"{THINK}{m['reasoning_content']}{END_THINK}" if keep_reasoning else END_THINK
            parts.append(ASSISTANT + opening + _text(m) + _calls(m.get("tool_calls") or ()) + EOS)
        elif role == "tool":
            pending_results.append(m)
        elif role not in ("system", "developer"):
            raise ValueError(f"unsupported role {role!r}; accepted: system, developer, user, assistant, tool")
    if pending_results:
        parts.append(_results(pending_results))
    if add_generation_prompt:
        parts.append(ASSISTANT + (THINK if thinking else END_THINK))
    return "".join(parts)


def _text(m: Mapping[str, Any]) -> str:
    content = m.get("content")
    return content if isinstance(content, str) else ""


def _function(tool: Mapping[str, Any]) -> Mapping[str, Any]:
    return tool.get("function", tool)


def _calls(calls: Sequence[Mapping[str, Any]]) -> str:
    if not calls:
        return ""
    lines = ["\n\n" + TOOL_CALLS_BEGIN]
    for call in calls:
        fn = call["function"]
        try:
            args = json.loads(fn.get("arguments") or "{}")
        except json.JSONDecodeError:
            raise ValueError(f"tool call {fn.get('name')!r}: arguments are not JSON") from None
        if not isinstance(args, dict):
            raise ValueError(f"tool call {fn.get('name')!r}: arguments must be a JSON object")
        lines.append(f"<{DSML}invoke name=\"{fn['name']}\">")
        for name, value in args.items():
            is_str = isinstance(value, str)
            text = value if is_str else json.dumps(value, ensure_ascii=False)
            lines.append(f"<{DSML}parameter name=\"{name}\" string=\"{'true' if is_str else 'false'}\">"
                         f"{text}</{DSML}parameter>")
        lines.append(f"</{DSML}invoke>")
    lines.append(TOOL_CALLS_END)
    return "\n".join(lines)


def _results(results: Sequence[Mapping[str, Any]]) -> str:
    body = "\n".join(f"<{DSML}result tool_call_id=\"{m.get('tool_call_id') or ''}\">{_text(m)}</{DSML}result>"
                     for m in results)
    return f"{USER}<{DSML}function_results>\n{body}\n</{DSML}function_results>"
