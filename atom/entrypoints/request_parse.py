"""Request body -> validated pydantic model, or an :class:`ApiError` (4xx) saying what is wrong.

Runs in the server's parse thread pool (never on the event loop). The order is cheapest-first so a
hostile body costs little: JSON decoding (bounded by ``max_body_bytes``); on the raw JSON, every
count limit before any per-entry work (prompts, messages, stop strings, ``logit_bias`` entries,
``stop_token_ids``, ``n``, ``best_of``), then the per-entry checks those counts bound (stop string
lengths, ``logit_bias`` keys), token-id prompts against ``max_model_len``, then the characters of
everything that can reach the prompt (:func:`prompt_chars_raw`: text prompts; every value of a
chat's ``messages``, ``tools``, ``response_format``, ``tool_choice`` and ``chat_template_kwargs``,
keys included -- so no field can smuggle megabytes into templating or tokenization, however the
chat format maps it); a scan for lone surrogates (text that is not Unicode and could not even be
echoed in an error message), when the raw body can hold one; then strict validation. All of it is
linear in the body's size. A large body has been through the same checks in a helper process
before (``body_precheck.py``).
Every failure of the JSON layer is a 400 ``invalid_json``: malformed syntax, a body that is not
UTF-8/16/32, an integer over Python's digit limit, nesting too deep.
"""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic import BaseModel, ValidationError

from atom.entrypoints.limits import ServerLimits
from atom.entrypoints.protocol import ApiError

__all__ = ["parse_body", "check_unicode", "prompt_chars_raw", "MAX_TOKEN_ID_DIGITS"]

#: ``logit_bias`` keys are token ids in ASCII decimal; no vocabulary needs more digits than this.
MAX_TOKEN_ID_DIGITS = 10


def parse_body(raw: bytes, model: type[BaseModel], limits: ServerLimits, max_model_len: int | None = None) -> Any:
    """Decode, size-check and validate ``raw`` as ``model``; raises :class:`ApiError` (400).

    ``max_model_len``: token-id prompts longer than this are refused before validation (validating a
    list of a million integers holds the interpreter lock long enough to delay other clients)."""
    data = _decode(raw)
    _check_sizes(data, limits)
    if max_model_len is not None:
        _check_token_ids(data.get("prompt"), max_model_len)
    _check_prompt_chars(data, "chat" if "messages" in model.model_fields else "completion", limits)
    if _may_hold_surrogates(raw):
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
    """Count limits on the raw JSON (O(1) each), then the per-entry checks they bound."""
    _at_most(data.get("prompt"), lim.max_prompts, "prompt", "prompts", nested=True)
    _at_most(data.get("messages"), lim.max_messages, "messages", "messages")
    stop = data.get("stop")
    _at_most(stop, lim.max_stop_strings, "stop", "stop strings")
    _at_most(data.get("stop_token_ids"), lim.max_stop_token_ids, "stop_token_ids", "stop_token_ids entries")
    bias = data.get("logit_bias")
    if isinstance(bias, dict) and len(bias) > lim.max_logit_bias:
        raise ApiError(400, f"logit_bias has {len(bias)} entries, over the limit of {lim.max_logit_bias} per request",
                       param="logit_bias")
    for s in [stop] if isinstance(stop, str) else stop if isinstance(stop, list) else []:
        if isinstance(s, str) and len(s) > lim.max_stop_chars:
            raise ApiError(400, f"a stop string of {len(s)} characters is over the limit of {lim.max_stop_chars}",
                           param="stop")
    for name in ("n", "best_of"):
        value = data.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and not 1 <= value <= lim.max_n:
            raise ApiError(400, f"{name}={value} must be between 1 and {lim.max_n}", param=name)
    if isinstance(bias, dict):
        for key in bias:
            _check_token_id_key(key)


def _check_token_id_key(key: str) -> None:
    """A ``logit_bias`` key is a token id in ASCII decimal digits (``str.isdigit`` also takes "³", "①"
    and "٣", which are no token ids), short enough that ``int()`` is cheap."""
    if not (0 < len(key) <= MAX_TOKEN_ID_DIGITS and key.isascii() and key.isdigit()):
        raise ApiError(400, f"logit_bias key {_short(key, 40)!r} is not a token id: keys are token ids in ASCII "
                            f"decimal digits (at most {MAX_TOKEN_ID_DIGITS})", param="logit_bias")


#: The fields of a raw body that can reach the prompt, per endpoint.
PROMPT_FIELDS = {"chat": ("messages", "tools", "response_format", "tool_choice", "chat_template_kwargs"),
                 "completion": ("prompt",)}


def prompt_chars_raw(data: dict[str, Any], fields: tuple[str, ...], stop_after: int) -> tuple[int, str | None]:
    """``(characters, field)``: the characters the values under ``fields`` of the raw body bring to a
    prompt -- every string's length (keys included, at any depth), and at least one for every other
    value (a number or ``true`` in a tools schema is written into the prompt too). Token-id prompts
    count nothing (their length is checked against ``max_model_len``). Counting stops once the total
    is over ``stop_after``, and ``field`` is then the one whose value crossed it (else None), so the
    cost is bounded by the limit, not by the body."""
    total = 0
    for name in fields:
        root = data.get(name)
        if root is None or (name == "prompt" and isinstance(root, list) and root and not isinstance(root[0], str)):
            continue  # absent, or token ids
        stack = [root]
        while stack:
            item = stack.pop()
            if isinstance(item, str):
                total += len(item)
            elif isinstance(item, dict):
                total += sum(len(k) for k in item if isinstance(k, str))
                stack.extend(item.values())
            elif isinstance(item, list):
                total += 1
                stack.extend(item)
            else:
                total += 1
            if total > stop_after:
                return total, name
    return total, None


def _check_prompt_chars(data: dict[str, Any], kind: str, lim: ServerLimits) -> None:
    """Before validation, templating or tokenization: what reaches the prompt fits ``max_prompt_chars``."""
    limit = lim.max_prompt_chars
    assert limit is not None, "ServerLimits.for_model() resolves max_prompt_chars before serving"
    _, field = prompt_chars_raw(data, PROMPT_FIELDS[kind], limit)
    if field is not None:
        what = ("the chat's messages, tools and response_format (every string in them, keys included)" if kind == "chat"
                else "the prompt")
        raise ApiError(400, f"{what} come to more than {limit} characters, the limit of this server "
                            f"(--max-prompt-chars); {field} crossed it", param=field, code="context_length_exceeded")


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


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _may_hold_surrogates(raw: bytes) -> bool:
    """False when the decoded body cannot hold a lone surrogate: strict UTF-8 cannot encode one, so
    in a UTF-8 body only a ``\\uD800``-``\\uDFFF`` escape makes one (then the full scan decides)."""
    return json.detect_encoding(raw) != "utf-8" or _SURROGATE_ESCAPE.search(raw) is not None


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
