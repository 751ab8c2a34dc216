"""Request body -> validated pydantic model, or an :class:`ApiError` (4xx) saying what is wrong.

Runs in the server's parse thread pool (never on the event loop). The order is cheapest-first so a
hostile body costs little: JSON decoding (bounded by ``max_body_bytes``), list-length limits on the
raw JSON (prompts, messages, stop strings, ``n``, ``best_of``), a scan for lone surrogates (text
that is not Unicode and could not even be echoed in an error message), then strict validation.
Every failure of the JSON layer is a 400 ``invalid_json``: malformed syntax, a body that is not
UTF-8/16/32, an integer over Python's digit limit, nesting too deep.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ValidationError

from atom.entrypoints.limits import ServerLimits
from atom.entrypoints.protocol import ApiError

__all__ = ["parse_body", "check_unicode"]


def parse_body(raw: bytes, model: type[BaseModel], limits: ServerLimits, max_model_len: int | None = None) -> Any:
    """Decode, size-check and validate ``raw`` as ``model``; raises :class:`ApiError` (400).

    ``max_model_len``: token-id prompts longer than this are refused before validation (validating a
    list of a million integers holds the interpreter lock long enough to delay other clients)."""
    data = _decode(raw)
    _check_sizes(data, limits)
    if max_model_len is not None:
        _check_token_ids(data.get("prompt"), max_model_len)
    check_unicode(data)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        message, param = _validation_message(exc)
        raise ApiError(400, message, param=param, code="invalid_type") from None


def _decode(raw: bytes) -> dict[str, Any]:
    try:
        data = json.loads(raw)
    except RecursionError:
        raise ApiError(400, "malformed JSON body: nested too deeply", code="invalid_json") from None
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError, the int digit limit
        raise ApiError(400, f"malformed JSON body: {_short(str(exc))}", code="invalid_json") from None
    if not isinstance(data, dict):
        raise ApiError(400, f"the JSON body must be an object, got {type(data).__name__}", code="invalid_json")
    return data


def _short(text: str, limit: int = 200) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


def _check_sizes(data: dict[str, Any], lim: ServerLimits) -> None:
    """O(1) checks on the raw JSON, before any per-item work."""
    _at_most(data.get("prompt"), lim.max_prompts, "prompt", "prompts", nested=True)
    _at_most(data.get("messages"), lim.max_messages, "messages", "messages")
    stop = data.get("stop")
    _at_most(stop, lim.max_stop_strings, "stop", "stop strings")
    for s in [stop] if isinstance(stop, str) else stop if isinstance(stop, list) else []:
        if isinstance(s, str) and len(s) > lim.max_stop_chars:
            raise ApiError(400, f"a stop string of {len(s)} characters is over the limit of {lim.max_stop_chars}",
                           param="stop")
    for name in ("n", "best_of"):
        value = data.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and not 1 <= value <= lim.max_n:
            raise ApiError(400, f"{name}={value} must be between 1 and {lim.max_n}", param=name)


def _check_token_ids(prompt: Any, max_model_len: int) -> None:
    if not isinstance(prompt, list) or not prompt or isinstance(prompt[0], str):
        return
    lengths = [len(p) for p in prompt if isinstance(p, list)] if isinstance(prompt[0], list) else [len(prompt)]
    if lengths and max(lengths) >= max_model_len:
        raise ApiError(400, f"This model's maximum context length is {max_model_len} tokens, but the prompt has "
                            f"{max(lengths)} tokens (at most {max_model_len - 1} leave room for one output token).",
                       param="prompt", code="context_length_exceeded")


def _at_most(value: Any, limit: int, param: str, what: str, nested: bool = False) -> None:
    if not isinstance(value, list):
        return
    if nested and value and not isinstance(value[0], (str, list)):
        return  # a single prompt of token ids: its length is checked against max_model_len
    if len(value) > limit:
        raise ApiError(400, f"{len(value)} {what} is over the limit of {limit} per request", param=param)


def check_unicode(data: Any) -> None:
    """Raise a 400 if any string (key or value) holds a lone surrogate (``"\\ud800"``)."""
    stack = [(data, None)]
    while stack:
        item, top = stack.pop()
        if isinstance(item, str):
            _check_str(item, top)
        elif isinstance(item, dict):
            for k, v in item.items():
                _check_str(k, top or k)
                stack.append((v, top or k))
        elif isinstance(item, list):
            stack.extend((v, top) for v in item)


def _check_str(text: str, param: str | None) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ApiError(400, f"{param or 'body'}: text is not valid Unicode (a lone surrogate at position "
                            f"{exc.start}); send UTF-8 text, with surrogate pairs in \\u escapes",
                       param=param if param is None else _safe(param), code="invalid_unicode") from None


def _safe(text: str) -> str:
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _validation_message(exc: ValidationError) -> tuple[str, str | None]:
    errors = exc.errors()
    first = errors[0] if errors else {"loc": (), "msg": "invalid request"}
    loc = ".".join(str(p) for p in first["loc"] if not (isinstance(p, str) and "[" in p)) or None
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{loc or 'body'}: {first['msg']}{more}", loc.split(".")[0] if loc else None
