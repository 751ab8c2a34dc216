"""A DeepSeek-V4 answer split into ``reasoning_content``, ``content`` and OpenAI ``tool_calls`` as it streams.

:class:`ChatOutputParser` is the streaming form of :func:`~atom.entrypoints.dsv4_answer.parse_completion`:
fed the answer piece by piece, it releases reasoning and content as soon as they are decided, and
its pieces joined equal that one-shot parse, however the answer was cut into pieces::

    reasoning --"</think>"--> content --"\\n\\n<｜DSML｜tool_calls"--> tool block --(end)--> tool_calls
        (thinking mode only)      |--"<｜end▁of▁sentence｜>"--> end

* Text that could still be the start of a marker (``</``, ``\\n\\n<｜DS``, ...) is held back until the
  next piece decides it, so no piece of a marker is ever released as reasoning or content.
* A tool-call block is held whole and read at the end by the one-shot parser, so its calls are
  exactly the parser's; they are released with the last piece (the block is the end of the answer).
* When the answer leaves the format (the cases where the one-shot parser raises), what was
  released stays, and the rest of the text, from the point where the answer stopped fitting the
  format, is released as ``content`` with the format's control strings made inert (:func:`inert`),
  so a client never receives one of them: ``｜`` becomes ``|`` (``<|DSML|invoke name="f">``),
  ``<think>`` / ``</think>`` become ``<think >`` / ``</think >``, and an end-of-sentence token that
  ends the answer is dropped. An answer that stops while still reasoning keeps that text as
  reasoning (a thinking answer cut by ``max_tokens``). :attr:`ChatOutputParser.error` then holds the
  one-shot parser's message.

Every decision depends only on the text seen so far, never on where the pieces were cut, which is
why the pieces always join to the same result (tests feed every example one character at a time).
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from atom.entrypoints.dsv4_answer import (ANSWER_ERRORS, BOS, CONTROL_STRINGS, DSML, END_THINK, EOS, THINK,
                                          TOOL_CALLS_START, parse_completion)

__all__ = ["ChatDelta", "ChatOutputParser", "inert"]

# What ends each state. Besides its exits, each lists the control strings that may not appear in it:
# meeting one means the answer cannot parse, whatever follows.
_MARKERS = {"reasoning": (END_THINK, TOOL_CALLS_START, BOS, EOS, THINK, DSML),
            "content": (EOS, TOOL_CALLS_START, BOS, THINK, END_THINK, DSML)}
_CONTROL = re.compile("|".join(re.escape(c) for c in CONTROL_STRINGS))
_INERT = {BOS: BOS.replace("｜", "|"), EOS: EOS.replace("｜", "|"), THINK: "<think >", END_THINK: "</think >",
          DSML: DSML.replace("｜", "|")}


@dataclass
class ChatDelta:
    """What one piece of answer text adds. ``tool_calls`` entries are OpenAI stream entries:
    ``{"index", "id", "type": "function", "function": {"name", "arguments"}}``."""

    reasoning: str = ""
    content: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.reasoning or self.content or self.tool_calls)

    def extend(self, other: ChatDelta) -> ChatDelta:
        """This delta followed by ``other`` (a new object)."""
        return ChatDelta(self.reasoning + other.reasoning, self.content + other.content,
                         self.tool_calls + other.tool_calls)


def inert(text: str) -> str:
    """``text`` with every control string made inert (see the module docstring); no control string
    can appear in the result, not even one formed across a replacement."""
    writer = _InertText()
    return writer.feed(text) + writer.finish()


def _next_marker(buf: str, markers: tuple[str, ...]) -> tuple[int, str | None]:
    """How far the undecided text ``buf`` can be released: ``(pos, marker)`` for the marker that
    starts first, or ``(pos, None)`` where a possible marker start runs to the end of ``buf`` before
    any complete one (held until more text decides), or ``(len(buf), None)``."""
    best, found = len(buf), None
    for marker in markers:
        pos = buf.find(marker)
        if pos != -1 and pos < best:
            best, found = pos, marker
    longest = max(len(m) for m in markers)
    for start in range(max(0, len(buf) - longest + 1), best):
        rest = buf[start:]
        if any(len(rest) < len(m) and m.startswith(rest) for m in markers):
            return start, None
    return best, found


class _InertText:
    """Streams text with the control strings replaced by their inert forms; an end-of-sentence token
    is held while it ends the text so far, and dropped if nothing follows it. One regex pass per piece
    (linear: a long answer full of control strings is read at once when not streamed)."""

    def __init__(self) -> None:
        self._held = ""

    def feed(self, text: str) -> str:
        buf, out, at = self._held + text, [], 0
        hold = None
        for found in _CONTROL.finditer(buf):
            if found.group() == EOS and found.end() == len(buf):
                hold = found.start()  # the answer's end, unless more text follows
                break
            out += [buf[at:found.start()], _INERT[found.group()]]
            at = found.end()
        if hold is None:  # a possible control string start at the end (a proper prefix: plain text so far)
            hold = _next_marker(buf[at:], CONTROL_STRINGS)[0] + at
        out.append(buf[at:hold])
        self._held = buf[hold:]
        return "".join(out)

    def finish(self) -> str:
        held, self._held = self._held, ""
        return "" if held == EOS else held  # otherwise a proper prefix of a control string: plain text


class ChatOutputParser:
    """Feed the answer's text (:meth:`feed`), then :meth:`finish`; each returns a :class:`ChatDelta`.

    ``thinking``: the prompt opened ``<think>`` (the answer starts with reasoning). After
    :meth:`finish`, :attr:`error` is None when the answer parsed, else the one-shot parser's message.
    """

    def __init__(self, thinking: bool) -> None:
        self.thinking = thinking
        self.error: str | None = None
        self.num_calls = 0
        self._state = "reasoning" if thinking else "content"  # then: block, after_eos, failed
        self._buf = ""  # undecided text of the current state (empty in "block")
        self._pieces: list[str] = []
        self._fed = 0
        self._block_start = 0
        self._sent = {"reasoning": 0, "content": 0}
        self._inert = _InertText()
        self._finished = False

    def feed(self, text: str) -> ChatDelta:
        if self._finished:
            raise RuntimeError("ChatOutputParser.feed after finish")
        delta = ChatDelta()
        if text:
            self._pieces.append(text)
            self._fed += len(text)
            if self._state != "block":
                self._buf += text
                self._advance(delta)
        return delta

    def finish(self, ended: bool) -> ChatDelta:
        """The answer is over. ``ended``: it was closed by the end-of-sentence token, which the fed
        text does not hold (a server strips the stopping token); False when it was cut short."""
        delta = self.feed(EOS) if ended else ChatDelta()
        self._finished = True
        try:
            result = parse_completion("".join(self._pieces), "thinking" if self.thinking else "chat")
        except ANSWER_ERRORS as exc:
            self.error, result = str(exc), None
        if result is not None and self._state in ("block", "after_eos"):
            self._emit(delta, "reasoning", result["reasoning_content"][self._sent["reasoning"]:])
            self._emit(delta, "content", result["content"][self._sent["content"]:])
            delta.tool_calls = [self._call(c["function"]) for c in result["tool_calls"]]
        else:
            self._recover(delta)
        return delta

    def _advance(self, delta: ChatDelta) -> None:
        """Release what the text held so far decides; move between states at markers."""
        while self._state in ("reasoning", "content"):
            where = self._state
            pos, marker = _next_marker(self._buf, _MARKERS[where])
            self._emit(delta, where, self._buf[:pos])
            self._buf = self._buf[pos:]
            if marker is None:
                return
            if where == "reasoning" and marker == END_THINK:
                self._buf, self._state = self._buf[len(END_THINK):], "content"
            elif where == "content" and marker == TOOL_CALLS_START:
                self._block_start, self._buf, self._state = self._fed - len(self._buf), "", "block"
            elif where == "content" and marker == EOS:
                self._state = "after_eos"
            else:
                self._state = "failed"
        if self._state == "after_eos" and len(self._buf) > len(EOS):
            self._state = "failed"  # text after the end-of-sentence token
        if self._state == "failed":
            self._emit(delta, "content", self._inert.feed(self._buf))
            self._buf = ""

    def _recover(self, delta: ChatDelta) -> None:
        """The answer did not parse: the undecided rest, made inert, ends the field it was in
        (reasoning when the text stopped while reasoning, else content)."""
        if self._state == "block":
            rest = "".join(self._pieces)[self._block_start:]
        else:
            rest, self._buf = self._buf, ""
        where = "reasoning" if self._state == "reasoning" else "content"
        self._emit(delta, where, self._inert.feed(rest) + self._inert.finish())
        self._state = "failed"

    def _emit(self, delta: ChatDelta, where: str, text: str) -> None:
        if text:
            setattr(delta, where, getattr(delta, where) + text)
            self._sent[where] += len(text)

    def _call(self, function: dict[str, str]) -> dict[str, Any]:
        call = {"index": self.num_calls, "id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                "function": {"name": function["name"], "arguments": function["arguments"]}}
        self.num_calls += 1
        return call
