"""A DeepSeek-V4 answer split into ``reasoning_content``, ``content`` and OpenAI ``tool_calls`` as it streams.

The answer's text passes through three states::

    reasoning --"</think>"--> content --"<｜DSML｜tool_calls>"--> tool block --"</｜DSML｜tool_calls>"--> content

Thinking mode starts in ``reasoning`` (the prompt opened ``<think>``); non-thinking mode in
``content``. The markers are found with :class:`MarkerSplitter`, which holds back text that could be
the start of a marker, so no partial marker is ever sent as content. A tool block is sent only once
it is complete, as parsed ``tool_calls`` (arguments as a JSON string, as OpenAI sends them). A block
the answer leaves unfinished, or one that does not parse, is returned as plain content rather than
lost. A marker that does not belong to the current state (``</think>`` inside the content) is text.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from atom.entrypoints.dsv4_encoding import DSML, END_THINK, TOOL_CALLS_BEGIN, TOOL_CALLS_END
from atom.model_engine.stop_strings import MarkerSplitter

__all__ = ["ChatDelta", "ChatOutputParser", "parse_tool_calls"]

_INVOKE = re.compile(rf'<{DSML}invoke name="([^"]*)">(.*?)</{DSML}invoke>', re.S)
_PARAM = re.compile(rf'<{DSML}parameter name="([^"]*)" string="(true|false)">(.*?)</{DSML}parameter>', re.S)


@dataclass
class ChatDelta:
    """What one piece of answer text adds."""

    reasoning: str = ""
    content: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content or self.tool_calls)


def parse_tool_calls(block: str) -> list[dict[str, Any]] | None:
    """OpenAI ``tool_calls`` of the DSML between the tool-call markers; None if it does not parse."""
    calls = []
    for name, body in _INVOKE.findall(block):
        args: dict[str, Any] = {}
        for pname, is_str, value in _PARAM.findall(body):
            if is_str == "true":
                args[pname] = value
            else:
                try:
                    args[pname] = json.loads(value)
                except json.JSONDecodeError:
                    return None
        calls.append({"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                      "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}})
    leftover = _INVOKE.sub("", block).strip()
    return calls if calls and not leftover else None


class ChatOutputParser:
    """Feed the answer's released text; get :class:`ChatDelta` pieces (see the module docstring)."""

    def __init__(self, thinking: bool, tools: bool) -> None:
        self.state = "reasoning" if thinking else "content"
        self._tools = tools
        markers = (END_THINK, TOOL_CALLS_BEGIN, TOOL_CALLS_END) if tools else (END_THINK,)
        self._splitter = MarkerSplitter(markers)
        self._block: list[str] = []
        self.num_calls = 0

    def feed(self, text: str) -> ChatDelta:
        delta = ChatDelta()
        for piece, marker in self._splitter.feed(text):
            self._add(delta, piece)
            if marker is not None:
                self._on_marker(delta, marker)
        return delta

    def finish(self) -> ChatDelta:
        """The answer ended: release held text; an unfinished tool block becomes content."""
        delta = ChatDelta()
        self._add(delta, self._splitter.flush())
        if self.state == "tools":
            delta.content += TOOL_CALLS_BEGIN + "".join(self._block)
            self._block, self.state = [], "content"
        return delta

    def _add(self, delta: ChatDelta, text: str) -> None:
        if self.state == "reasoning":
            delta.reasoning += text
        elif self.state == "content":
            delta.content += text
        else:
            self._block.append(text)

    def _on_marker(self, delta: ChatDelta, marker: str) -> None:
        if self.state == "reasoning" and marker == END_THINK:
            self.state = "content"
        elif self.state == "content" and marker == TOOL_CALLS_BEGIN:
            self.state = "tools"
        elif self.state == "tools" and marker == TOOL_CALLS_END:
            block, self._block, self.state = "".join(self._block), [], "content"
            calls = parse_tool_calls(block)
            if calls is None:
                delta.content += TOOL_CALLS_BEGIN + block + TOOL_CALLS_END
            else:
                for call in calls:
                    delta.tool_calls.append({"index": self.num_calls, **call})
                    self.num_calls += 1
        else:
            self._add(delta, marker)
