"""Which chat format a request is rendered in, the OpenAI -> DeepSeek-V4 mapping, and the prompt text.

Two renderers: the checkpoint's own jinja ``chat_template`` (plain conversations), and the
DeepSeek-V4 encoding (:func:`atom.entrypoints.dsv4_encoding.encode_messages`). A request uses the
DeepSeek-V4 encoding when the checkpoint ships no template, or when it asks for something only that
format expresses: ``tools``, ``response_format`` (JSON), a thinking choice, ``reasoning_effort``,
messages with ``tool_calls`` / ``reasoning_content``, or the ``tool``, ``developer`` or
``latest_reminder`` role. Such a request's answer is split into ``reasoning_content`` / ``content`` /
``tool_calls`` (:class:`ChatFormat` says how), and its text keeps the format's markers.

The mapping (every refusal is an :class:`ApiError` 400 naming the parameter):

* messages map one to one (roles ``system``, ``developer``, ``user``, ``assistant``, ``tool``,
  ``latest_reminder``); content-part lists become their texts joined with a blank line; ``name`` is
  refused (the format has no field for it), as are ``tool_calls`` / ``reasoning_content`` off an
  assistant message and ``tool_call_id`` off a tool message;
* ``tools`` and a JSON ``response_format`` go on the conversation's opening system message (a new,
  empty one at the start when the first message is not a system message), where the format declares
  them, so they always precede the conversation; ``tool_choice`` ``"auto"`` (the default)
  declares the tools, ``"none"`` leaves them out of the prompt, ``"required"`` or a named function is
  refused: the format cannot force a call;
* thinking mode: ``chat_template_kwargs.thinking`` (or ``enable_thinking``), else ``thinking`` (a
  boolean or ``{"type": "enabled" | "disabled"}``; ``budget_tokens`` is refused); default off;
* ``reasoning_effort``: ``"high"`` or ``"max"``, thinking mode only; OpenAI's ``"minimal"``,
  ``"low"`` and ``"medium"`` are refused (the format has no lower level).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from atom.entrypoints.dsv4_encoding import encode_messages
from atom.entrypoints.dsv4_tools_block import to_json
from atom.entrypoints.protocol import ApiError, ChatCompletionRequest, ChatMessage, ThinkingOption

if TYPE_CHECKING:
    from atom.tokenizer import Tokenizer

__all__ = ["ChatFormat", "render_chat_prompt", "check_chat_options", "encoder_messages", "prompt_chars",
           "ROLES"]

#: Roles a chat request may use.
ROLES = ("system", "developer", "user", "assistant", "tool", "latest_reminder")
_DSV4_ONLY_ROLES = ("tool", "developer", "latest_reminder")
_TEMPLATE_KWARGS = ("thinking", "enable_thinking")
_RESPONSE_FORMATS = ("text", "json_object", "json_schema")


@dataclass(frozen=True)
class ChatFormat:
    """How to read the answer of a DeepSeek-V4-encoded request."""

    thinking: bool
    tools: bool  # tools were declared in the prompt


def render_chat_prompt(tok: "Tokenizer", req: ChatCompletionRequest) -> tuple[str, ChatFormat | None]:
    """``(prompt text, ChatFormat or None for the jinja template)``. Raises :class:`ApiError` for a
    request the mapping refuses and ``ValueError`` for a conversation the format rejects."""
    check_chat_options(req)
    if not _uses_dsv4(tok, req):
        messages = [{"role": m.role, "content": m.text()} for m in req.messages]
        return tok.apply_chat_template(messages, add_generation_prompt=req.add_generation_prompt), None
    if not req.add_generation_prompt:
        raise ApiError(400, "add_generation_prompt=false is not available with the DeepSeek-V4 chat format "
                            "(the prompt always ends with the answer's opening)", param="add_generation_prompt")
    thinking = bool(req.thinking_mode())
    messages, names = encoder_messages(req)
    text = encode_messages(messages, thinking_mode="thinking" if thinking else "chat",
                           reasoning_effort=req.reasoning_effort, names=names)
    return text, ChatFormat(thinking=thinking, tools=_declares_tools(req))


def _uses_dsv4(tok: "Tokenizer", req: ChatCompletionRequest) -> bool:
    return (tok.chat_template is None or bool(req.tools) or _response_format(req) is not None
            or req.thinking_mode() is not None or req.reasoning_effort is not None
            or any(m.role in _DSV4_ONLY_ROLES or m.tool_calls or m.reasoning_content is not None
                   for m in req.messages))


def check_chat_options(req: ChatCompletionRequest) -> None:
    """Refuse (400 naming it) what the mapping cannot honour; see the module docstring."""
    _check_thinking(req)
    if req.reasoning_effort not in (None, "high", "max"):
        raise ApiError(400, f"reasoning_effort {_shown(req.reasoning_effort)} is not available: the DeepSeek-V4 format "
                            "has 'high' (the default) and 'max'", param="reasoning_effort")
    if req.reasoning_effort is not None and not req.thinking_mode():
        raise ApiError(400, "reasoning_effort applies to thinking mode only; turn it on with "
                            "chat_template_kwargs {\"thinking\": true}", param="reasoning_effort")
    if req.tool_choice not in (None, "auto", "none"):
        raise ApiError(400, "tool_choice: only 'auto' and 'none' are available; the DeepSeek-V4 format cannot "
                            "force a call ('required' or a named function)", param="tool_choice",
                       code="unsupported_parameter")
    if req.parallel_tool_calls is False:
        raise ApiError(400, "parallel_tool_calls=false is not available: the DeepSeek-V4 format cannot limit "
                            "a turn to one call", param="parallel_tool_calls", code="unsupported_parameter")
    _declared_json_chars(req)
    for i, m in enumerate(req.messages):
        _check_message(i, m)


def _check_thinking(req: ChatCompletionRequest) -> None:
    for key, value in (req.chat_template_kwargs or {}).items():
        if key not in _TEMPLATE_KWARGS:
            raise ApiError(400, f"chat_template_kwargs.{_shown(key, quote=False)} is not a switch of this server; "
                                f"accepted: {', '.join(_TEMPLATE_KWARGS)}", param=f"chat_template_kwargs.{_shown(key, quote=False)}")
        if not isinstance(value, bool):
            raise ApiError(400, f"chat_template_kwargs.{key} must be true or false", param=f"chat_template_kwargs.{key}")
    if isinstance(req.thinking, ThinkingOption) and req.thinking.budget_tokens is not None:
        raise ApiError(400, "thinking.budget_tokens is not available: the DeepSeek-V4 format cannot bound the "
                            "reasoning (use max_tokens for the whole answer)", param="thinking.budget_tokens",
                       code="unsupported_parameter")


def _response_format(req: ChatCompletionRequest) -> dict[str, Any] | None:
    """The JSON ``response_format`` to declare (None for none or ``{"type": "text"}``); 400 otherwise."""
    rf = req.response_format
    if rf is None:
        return None
    kind = rf.get("type") if isinstance(rf, dict) else None
    if kind not in _RESPONSE_FORMATS:
        raise ApiError(400, f"response_format.type must be one of {', '.join(_RESPONSE_FORMATS)}",
                       param="response_format")
    if kind == "json_schema" and not isinstance(rf.get("json_schema"), dict):
        raise ApiError(400, "response_format.json_schema must be an object ({\"name\": ..., \"schema\": {...}})",
                       param="response_format.json_schema")
    return None if kind == "text" else rf


def _check_message(i: int, m: ChatMessage) -> None:
    where = f"messages[{i}]"
    if m.role not in ROLES:
        raise ApiError(400, f"{where}.role {_shown(m.role)} is not accepted; accepted: {', '.join(ROLES)}",
                       param=f"{where}.role")
    if m.name is not None:
        raise ApiError(400, f"{where}.name is not available: the DeepSeek-V4 chat format has no field for a "
                            "participant's name (put it in the content)", param=f"{where}.name",
                       code="unsupported_parameter")
    for field, owner in (("tool_calls", "assistant"), ("reasoning_content", "assistant"), ("tool_call_id", "tool")):
        if getattr(m, field) is not None and m.role != owner:
            raise ApiError(400, f"{where}.{field} is only accepted on a message of role '{owner}'",
                           param=f"{where}.{field}")
    if m.role == "tool" and m.tool_call_id is None:
        raise ApiError(400, f"{where}.tool_call_id is required on a message of role 'tool'",
                       param=f"{where}.tool_call_id")
    if m.content is None and m.role in ("user", "developer", "tool", "latest_reminder"):
        raise ApiError(400, f"{where}.content is required on a message of role '{m.role}'", param=f"{where}.content")
    if m.role == "developer" and not m.text():
        raise ApiError(400, f"{where}.content must not be empty on a message of role 'developer'",
                       param=f"{where}.content")


def _shown(text: str, limit: int = 40, quote: bool = True) -> str:
    """A client's string in an error message, cut to ``limit`` characters (it may be megabytes)."""
    cut = text if len(text) <= limit else text[:limit] + "..."
    return repr(cut) if quote else cut


def _declares_tools(req: ChatCompletionRequest) -> bool:
    return bool(req.tools) and req.tool_choice != "none"


def encoder_messages(req: ChatCompletionRequest) -> tuple[list[dict[str, Any]], list[str]]:
    """The request's messages as :func:`encode_messages` reads them, and how errors name each one
    (``messages[i]``, or ``request`` for a system message added to carry the declarations)."""
    messages = [_encoder_message(m) for m in req.messages]
    names = [f"messages[{i}]" for i in range(len(messages))]
    declared: dict[str, Any] = {}
    if _declares_tools(req):
        declared["tools"] = [t.model_dump() for t in req.tools or []]
    response_format = _response_format(req)
    if response_format is not None:
        declared["response_format"] = response_format
    if declared:
        if messages[0]["role"] != "system":
            messages.insert(0, {"role": "system", "content": ""})
            names.insert(0, "request")  # its errors read "request.tools[k]..." / "request.response_format"
        messages[0].update(declared)
    return messages, names


def _encoder_message(m: ChatMessage) -> dict[str, Any]:
    out: dict[str, Any] = {"role": m.role, "content": None if m.content is None else m.text()}
    if m.reasoning_content is not None:
        out["reasoning_content"] = m.reasoning_content
    if m.tool_calls:
        out["tool_calls"] = [c.model_dump() for c in m.tool_calls]
    if m.tool_call_id is not None:
        out["tool_call_id"] = m.tool_call_id
    return out


def prompt_chars(req: ChatCompletionRequest) -> int:
    """Characters of every request string that can reach the prompt, for ``--max-prompt-chars``:
    message contents, names, reasoning, tool calls (ids, names, arguments), tool_call_ids, the tools'
    JSON lines and the JSON ``response_format`` (the fixed texts the format adds around them are not
    counted)."""
    total = 0
    for m in req.messages:
        total += len(m.text()) + len(m.name or "") + len(m.reasoning_content or "") + len(m.tool_call_id or "")
        for c in m.tool_calls or []:
            total += len(c.id or "") + len(c.function.name) + len(c.function.arguments)
    return total + _declared_json_chars(req)


def _declared_json_chars(req: ChatCompletionRequest) -> int:
    """Characters of the tools' JSON lines and of a dict ``response_format``'s JSON; 400 naming the
    field when one is nested too deeply to be written."""
    total = 0
    for k, tool in enumerate(req.tools or []):
        total += len(_json(tool.function, f"tools[{k}].function", "tools"))
    if isinstance(req.response_format, dict):
        total += len(_json(req.response_format, "response_format", "response_format"))
    return total


def _json(value: Any, what: str, param: str) -> str:
    try:
        return to_json(value, what)
    except ValueError as exc:
        raise ApiError(400, str(exc), param=param) from None
