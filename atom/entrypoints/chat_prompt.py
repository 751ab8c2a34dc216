"""Which chat format a request is rendered in, and the prompt text.

Two renderers: the checkpoint's own jinja ``chat_template`` (plain conversations), and the
DeepSeek-V4 encoding (:mod:`dsv4_encoding`). A request uses the DeepSeek-V4 encoding when it asks for
something only that format expresses -- ``tools``, a thinking choice (``thinking`` or
``chat_template_kwargs.thinking``), messages carrying ``tool_calls`` / ``reasoning_content`` or the
``tool`` role -- or when the checkpoint ships no template. Such a request's answer is then split into
``reasoning_content`` / ``content`` / ``tool_calls`` (:class:`ChatFormat` says how), and its text keeps
special tokens so the markers (``</think>``) can be seen.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from atom.entrypoints.dsv4_encoding import render_dsv4_chat
from atom.entrypoints.protocol import ChatCompletionRequest

if TYPE_CHECKING:
    from atom.tokenizer import Tokenizer

__all__ = ["ChatFormat", "render_chat_prompt"]


@dataclass(frozen=True)
class ChatFormat:
    """How to read the answer of a DeepSeek-V4-encoded request."""

    thinking: bool
    tools: bool


def _message(m: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"role": m.role, "content": m.text()}
    if m.reasoning_content is not None:
        out["reasoning_content"] = m.reasoning_content
    if m.tool_calls:
        out["tool_calls"] = [c.model_dump() for c in m.tool_calls]
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    return out


def render_chat_prompt(tok: "Tokenizer", req: ChatCompletionRequest) -> tuple[str, ChatFormat | None]:
    """``(prompt text, ChatFormat or None for the jinja template)``; ``ValueError`` on a bad conversation."""
    messages = [_message(m) for m in req.messages]
    thinking = req.thinking_mode()
    uses_dsv4 = (bool(req.tools) or thinking is not None or tok.chat_template is None
                 or any(m.tool_calls or m.reasoning_content is not None or m.role == "tool" for m in req.messages))
    if not uses_dsv4:
        return tok.apply_chat_template(messages, add_generation_prompt=req.add_generation_prompt), None
    tools = [t.model_dump(exclude_none=True) for t in req.tools or []]
    text = render_dsv4_chat(messages, thinking=bool(thinking), tools=tools,
                            add_generation_prompt=req.add_generation_prompt)
    return text, ChatFormat(thinking=bool(thinking), tools=bool(tools))


def prompt_chars(req: ChatCompletionRequest) -> int:
    """Characters the conversation brings (content, reasoning, call arguments), for the size limit."""
    total = 0
    for m in req.messages:
        total += len(m.text()) + len(m.reasoning_content or "")
        total += sum(len(c.function.arguments) for c in m.tool_calls or [])
    return total
