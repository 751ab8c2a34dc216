"""Reading a DeepSeek-V4 completion back into an assistant message, as the release's parser does.

``parse_completion(text, thinking_mode)`` takes what the model generated after the prompt (after
``<｜Assistant｜><think>`` in thinking mode, after ``<｜Assistant｜></think>`` in chat mode, the final
end-of-sentence token included) and returns::

    {"role": "assistant", "content": str, "reasoning_content": str,
     "tool_calls": [{"type": "function", "function": {"name": str, "arguments": str}}, ...]}

The accepted layout is ``[REASONING</think>]CONTENT["\\n\\n" + DSML block]<｜end▁of▁sentence｜>``; the
end-of-sentence token may be missing after a tool-call block. It follows the release's parser field
for field, including its error cases and its lenient corners, because an answer read differently
from how the model meant it (or re-encoded differently in the next turn) is the format drift this
module exists to avoid:

* ``content`` and ``reasoning_content`` are verbatim (nothing trimmed); the ``"\\n\\n"`` before a
  tool-call block belongs to the block, not to ``content``.
* ``arguments`` is a JSON text assembled without validation: ``{"KEY": VALUE, ...}`` where a
  ``string="true"`` value is written as a JSON string and a ``string="false"`` value is copied
  exactly as the model wrote it (``["hw","p1"]`` and ``1E2`` stay so), even when it is not valid
  JSON (``{"when": tomorrow at 9}``); the call is still returned. No ``id`` is produced.
* Anything else raises, with the release's exception type and message: ``AssertionError`` for the
  overall structure (missing ``</think>``, missing end-of-sentence token, text after it or after
  the block, a control string inside content or reasoning), ``ValueError`` for a malformed
  tool-call block. :data:`ANSWER_ERRORS` is the pair to catch.

The streaming counterpart, which emits pieces while the answer is generated and ends on the same
result, is :class:`atom.entrypoints.chat_output.ChatOutputParser`.
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["parse_completion", "ANSWER_ERRORS", "BOS", "EOS", "THINK", "END_THINK", "DSML", "TOOL_CALLS_START",
           "CONTROL_STRINGS"]

BOS, EOS = "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"
THINK, END_THINK = "<think>", "</think>"
DSML = "｜DSML｜"
TOOL_CALLS_START = f"\n\n<{DSML}tool_calls"  # the two newlines belong to the block, not to the content
CONTROL_STRINGS = (BOS, EOS, THINK, END_THINK, DSML)  # never allowed inside content or reasoning (this order)
ANSWER_ERRORS = (AssertionError, ValueError)

_BLOCK_END = f"</{DSML}tool_calls>"
_INVOKE, _INVOKE_END = f"<{DSML}invoke", f"</{DSML}invoke"
_PARAM, _PARAM_END = f"<{DSML}parameter", f"/{DSML}parameter"
# ``\n?\Z`` after the final newline: one blank line may follow an invoke header, and ``<`` + newline
# may end a parameter (the release's patterns end in ``$``, which also matches before a final newline).
_HEADER = re.compile(r'\s*name="(.*?)">\n\n?\Z', re.DOTALL)
_PARAMETER = re.compile(r' name="(.*?)" string="(true|false)">(.*?)<\n?\Z', re.DOTALL)
_SEPARATOR = ">\n"


def parse_completion(text: str, thinking_mode: str) -> dict[str, Any]:
    """The assistant message of the completion ``text``; ``thinking_mode`` is ``"thinking"`` or ``"chat"``.

    Raises ``AssertionError`` / ``ValueError`` (:data:`ANSWER_ERRORS`) with the release's messages when
    ``text`` is not a well-formed answer (see the module docstring), and ``ValueError`` naming the
    accepted values for any other ``thinking_mode``.
    """
    if thinking_mode not in ("chat", "thinking"):
        raise ValueError(f"thinking_mode must be 'chat' or 'thinking', got {thinking_mode!r}")
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    doc, index, reasoning = _Text(text), 0, ""
    if thinking_mode == "thinking":
        pos, stop = doc.first(0, (END_THINK, TOOL_CALLS_START))
        if stop != END_THINK:
            raise AssertionError("Invalid thinking format: missing </think>")
        reasoning, index = text[:pos], pos + len(END_THINK)
    pos, stop = doc.first(index, (EOS, TOOL_CALLS_START))
    if stop is None:
        raise AssertionError("Invalid format: missing EOS token")
    content, index = text[index:pos], pos + len(stop)
    calls: list[dict[str, str]] = []
    if stop == TOOL_CALLS_START:
        index, calls = _parse_block(doc, index)
        pos, stop = doc.first(index, (EOS,))
        if text[index:pos]:
            raise AssertionError("Unexpected content after tool calls")
        index = pos + len(EOS) if stop else pos
    if index != len(text):
        raise AssertionError("Unexpected content at end")
    for token in CONTROL_STRINGS:
        if token in content or token in reasoning:
            raise AssertionError(f"Unexpected special token '{token}' in content")
    return {"role": "assistant", "content": content, "reasoning_content": reasoning,
            "tool_calls": [{"type": "function", "function": call} for call in calls]}


class _Text:
    """The completion, with ``find`` remembering each string's next occurrence: the parse only moves
    forward, so a remembered position stays valid until passed, and a block of many invokes costs one
    scan for its closing tag instead of one per invoke."""

    def __init__(self, text: str) -> None:
        self.text = text
        self._next: dict[str, tuple[int, int]] = {}  # string -> (searched from, found at or -1)

    def find(self, s: str, start: int) -> int:
        since, pos = self._next.get(s, (len(self.text) + 1, -1))
        if not (since <= start and (pos == -1 or pos >= start)):
            pos = self.text.find(s, start)
            self._next[s] = (start, pos)
        return pos

    def first(self, start: int, stops: tuple[str, ...]) -> tuple[int, str | None]:
        """``(position, stop)`` of the earliest of ``stops`` at or after ``start`` (a tie goes to the one
        listed first); ``(len(text), None)`` when none occurs."""
        best, found = len(self.text), None
        for stop in stops:
            pos = self.find(stop, start)
            if pos != -1 and pos < best:
                best, found = pos, stop
        return best, found

    def read(self, start: int, stops: tuple[str, ...]) -> tuple[str, int, str | None]:
        """``(text before the first stop, index after that stop, the stop)``; the rest of the text and
        ``None`` when no stop occurs."""
        pos, stop = self.first(start, stops)
        return self.text[start:pos], pos + (len(stop) if stop else 0), stop


def _parse_block(doc: _Text, index: int) -> tuple[int, list[dict[str, str]]]:
    """The invokes after ``TOOL_CALLS_START``; returns the index after the block and the calls.

    Text that ends inside the block ends the loop quietly (the release's leniency: a block cut
    right after an invoke header, or before its first invoke, still reads)."""
    calls = []
    while index < len(doc.text):
        between, index, stop = doc.read(index, (_INVOKE, _BLOCK_END))
        if between != _SEPARATOR:
            raise ValueError(f"Tool call format error: expected '>\\n' but got '{between}'")
        if stop == _BLOCK_END:
            break
        if stop is None:
            raise ValueError("Missing special token in tool calls")
        index, call = _parse_invoke(doc, index)
        calls.append(call)
    return index, calls


def _parse_invoke(doc: _Text, index: int) -> tuple[int, dict[str, str]]:
    """One invoke after ``<｜DSML｜invoke``: its name and parameters, up to ``</｜DSML｜invoke``."""
    header, index, stop = doc.read(index, (_PARAM, _INVOKE_END))
    match = _HEADER.match(header)
    if match is None:
        raise ValueError(f"Tool name format error: '{header}'")
    params: dict[str, tuple[str, str]] = {}
    while stop == _PARAM:
        body, index, _ = doc.read(index, (_PARAM_END,))
        found = _PARAMETER.match(body)
        if found is None:
            raise ValueError(f"Parameter format error: '{body}'")
        key, flag, value = found.groups()
        if key in params:
            raise ValueError(f"Duplicate parameter name: '{key}'")
        params[key] = (value, flag)
        between, index, stop = doc.read(index, (_PARAM, _INVOKE_END))
        if between != _SEPARATOR:
            raise ValueError(f"Parameter format error: expected '>\\n' but got '{between}'")
    return index, {"name": match.group(1), "arguments": _arguments(params)}


def _arguments(params: dict[str, tuple[str, str]]) -> str:
    """``{"KEY": VALUE, ...}``: string values JSON-encoded, the others copied as written."""
    entries = (f"{_json_string(key)}: {_json_string(value) if flag == 'true' else value}"
               for key, (value, flag) in params.items())
    return "{" + ", ".join(entries) + "}"


def _json_string(value: str) -> str:
    return json.dumps(value, ensure_ascii=False)
