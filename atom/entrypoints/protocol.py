"""Request and response shapes of the OpenAI-compatible API (pydantic models) and its error type.

Requests are validated *strictly* (``"5"`` is not an integer, ``true`` is not a number): a wrong
type is the client's bug and gets HTTP 400 with the field named, instead of a silent coercion.
Unknown fields are ignored, as the OpenAI API does for forward compatibility. Value ranges
(temperature, top_p, ...) are checked by :class:`atom.sampling_params.SamplingParams`, the one
place that knows them; the server turns its ``ValueError`` into HTTP 400.

Responses are built as plain dicts by the routes (see ``openai_server.py``); only their
``usage`` part has a helper here, because both endpoints and the stream share it.
"""

from __future__ import annotations

from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, field_validator

from atom.entrypoints.known_params import ChatExtras, CompletionExtras, StreamOptionExtras, VllmSamplingExtras

__all__ = ["ApiError", "StreamOptions", "ChatMessage", "CompletionRequest", "ChatCompletionRequest", "ToolSpec",
           "usage_dict", "error_body"]


class ApiError(Exception):
    """An error that becomes an OpenAI-style JSON body ``{"error": {message, type, param, code}}``."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code


def error_body(message: str, type: str, param: str | None = None, code: str | None = None) -> dict[str, Any]:
    """The JSON body of every error response. Text that is not Unicode (a lone surrogate echoed from
    the request) is escaped, so the body can always be encoded."""
    return {"error": {"message": _encodable(message), "type": type,
                      "param": None if param is None else _encodable(param), "code": code}}


def _encodable(text: str) -> str:
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class StreamOptions(_Strict, StreamOptionExtras):
    include_usage: bool = False


class _SamplingFields(_Strict, VllmSamplingExtras):
    """Fields both endpoints share; ranges are checked when SamplingParams is built. The known parameters
    the server refuses are declared in :mod:`atom.entrypoints.known_params` (``refused_parameter``)."""

    model: str
    n: int = 1
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None  # not in OpenAI's API; vLLM-style extra
    min_p: float | None = None  # vLLM-style extra (0 = off)
    seed: int | None = None
    stop: Union[str, list[str], None] = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False  # vLLM-style extra: keep going past the end-of-sequence token
    user: str | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None  # vLLM-style extra (1 = off)
    logit_bias: dict[str, float] | None = None  # token id (as a string) -> bias in [-100, 100]
    min_tokens: int = 0  # vLLM-style extra: no end-of-sequence / stop token before this many tokens
    stop_token_ids: list[int] | None = None  # vLLM-style extra
    include_stop_str_in_output: bool = False  # vLLM-style extra: the text ends with the stop string
    skip_special_tokens: bool = True  # vLLM-style extra: special tokens left out of the text
    # accepted so that asking for them is a clear 400 naming the parameter, never a silent 200
    best_of: int | None = None
    response_format: Any = None
    tools: Any = None
    tool_choice: Any = None
    functions: Any = None
    suffix: Any = None

    def unsupported(self) -> str | None:
        """The first parameter asked for that this server does not implement (None: all fine)."""
        if self.best_of is not None and self.best_of != self.n:
            return "best_of"
        if self.response_format not in (None, {"type": "text"}):
            return "response_format"
        for name in ("tools", "functions", "suffix"):
            if getattr(self, name):
                return name
        if self.tool_choice not in (None, "none", "auto"):
            return "tool_choice"
        return None

    def num_logprobs(self) -> int | None:
        """None: no log-probabilities; k >= 0: the sampled token's and the k most likely."""
        raise NotImplementedError


class CompletionRequest(_SamplingFields, CompletionExtras):
    """``POST /v1/completions``. ``prompt`` is text, a list of texts, token ids or lists of ids."""

    prompt: Union[str, list[str], list[int], list[list[int]]]
    max_tokens: int | None = 16
    echo: bool = False
    logprobs: int | None = None  # the legacy shape: k alternatives per token (0 = the sampled token only)

    def unsupported(self) -> str | None:
        if self.echo and self.logprobs is not None:
            return "logprobs"  # log-probabilities of the echoed prompt are not computed
        return super().unsupported()

    def num_logprobs(self) -> int | None:
        return self.logprobs


class ContentPart(_Strict):
    type: Literal["text"]
    text: str


class FunctionCall(_Strict):
    name: str
    arguments: str  # a JSON object, as a string (OpenAI's shape); "{}" for a call without arguments


class ToolCall(_Strict):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ToolSpec(_Strict):
    """A declared tool. ``function`` is kept as the request's JSON gave it (every key, in its order,
    ``"strict"`` included) because the prompt reproduces it verbatim; it must have a string ``name``."""

    type: Literal["function"]
    function: dict[str, Any]

    @field_validator("function")
    @classmethod
    def _named(cls, function: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(function.get("name"), str):
            raise ValueError("a tool's function needs a string 'name'")
        return function


class ThinkingOption(_Strict):
    type: Literal["enabled", "disabled"]
    budget_tokens: Any = None  # DeepSeek / Anthropic style; refused (the format cannot bound reasoning)


class ChatMessage(_Strict):
    role: str
    content: Union[str, list[ContentPart], None] = None
    name: str | None = None
    reasoning_content: str | None = None  # an earlier assistant turn's reasoning (DeepSeek's field)
    tool_calls: list[ToolCall] | None = None  # an earlier assistant turn's calls
    tool_call_id: str | None = None  # role "tool": the call this result answers

    def text(self) -> str:
        """The content as one string: text parts joined with a blank line (as the DeepSeek-V4 format
        joins the parts of a tool result)."""
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "\n\n".join(p.text for p in self.content)


class ChatCompletionRequest(_SamplingFields, ChatExtras):
    """``POST /v1/chat/completions``. ``max_completion_tokens`` wins over the older ``max_tokens``."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    add_generation_prompt: bool = True  # vLLM-style extra
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[ToolSpec] | None = None
    parallel_tool_calls: bool | None = None  # false is refused: the format cannot limit a turn to one call
    chat_template_kwargs: dict[str, Any] | None = None  # vLLM-style: {"thinking": bool}
    thinking: Union[bool, ThinkingOption, None] = None  # DeepSeek API style: {"type": "enabled"}
    reasoning_effort: str | None = None  # "high" or "max" (thinking mode); checked by chat_prompt

    def unsupported(self) -> str | None:
        # tools, tool_choice, response_format, reasoning_effort and the thinking switches are checked
        # (with a message saying what is accepted) when the prompt is built: chat_prompt.py
        for name in ("functions", "suffix"):
            if getattr(self, name):
                return name
        if self.best_of is not None and self.best_of != self.n:
            return "best_of"
        return None

    def thinking_mode(self) -> bool | None:
        """Thinking on / off as asked (``chat_template_kwargs`` first, then ``thinking``); None: not asked.
        The values' types are checked by ``chat_prompt.check_chat_options``."""
        kwargs = self.chat_template_kwargs or {}
        for key in ("thinking", "enable_thinking"):
            if key in kwargs:
                return bool(kwargs[key])
        if isinstance(self.thinking, ThinkingOption):
            return self.thinking.type == "enabled"
        return self.thinking

    def num_logprobs(self) -> int | None:
        if not self.logprobs:
            return None
        return self.top_logprobs or 0

    @property
    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    @property
    def max_tokens_param(self) -> str:
        return "max_completion_tokens" if self.max_completion_tokens is not None else "max_tokens"


def usage_dict(prompt_tokens: int, completion_tokens: int, cached_tokens: int) -> dict[str, Any]:
    """OpenAI ``usage`` with ``prompt_tokens_details.cached_tokens``."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}
