"""The server's size and time limits: what one client may send before any expensive work is done.

Every limit is an ``atom serve`` flag (``args.py``) with the default here, and is checked as early as
it can be: the body size while reading it, then on the raw parsed JSON before validation, templating
or tokenization (``request_parse.py``): counts (prompts, messages, stop strings, ``logit_bias``
entries, ``stop_token_ids``) before any per-entry work, and the characters of everything that can
reach the prompt (text prompts; every value of a chat's messages, tools and the other fields the chat
format writes, keys included); ``n`` / ``best_of`` before building anything. So a request that is
too big costs about as much as reading it, and parsing, validation, chat templating and tokenization
run in a small thread pool, never on the event loop (``request_parse.py``); a large body is decoded
in a helper process first (``body_precheck.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

__all__ = ["ServerLimits", "PROMPT_CHARS_PER_TOKEN"]

#: The default ``max_prompt_chars`` is this many characters per token of ``max_model_len``. Text a
#: model's tokenizer turns into at most ``max_model_len`` tokens rarely has more than about 4-5
#: characters per token (English prose; long runs of spaces in code reach more), so 8 leaves room
#: for any prompt that can fit, while the tokenizer's work on a refused prompt stays bounded by a
#: small multiple of what one admissible prompt costs (``docs/serving.md`` gives the stall measured).
PROMPT_CHARS_PER_TOKEN = 8


@dataclass(frozen=True)
class ServerLimits:
    """Limits of one server. Every field must be positive; ``ValueError`` names the bad one."""

    max_body_bytes: int = 4 * 1024 * 1024  #: largest request body
    #: characters of a request's text prompts, or of the strings of a chat's ``messages`` and ``tools``;
    #: None: ``PROMPT_CHARS_PER_TOKEN`` x ``max_model_len`` (see :meth:`for_model`)
    max_prompt_chars: int | None = None
    max_prompts: int = 256  #: prompts in one completions request
    max_messages: int = 1024  #: messages in one chat request
    max_stop_strings: int = 16  #: stop strings per request
    max_stop_chars: int = 256  #: characters of one stop string
    max_logit_bias: int = 1024  #: entries of ``logit_bias``
    max_stop_token_ids: int = 1024  #: entries of ``stop_token_ids``
    max_n: int = 64  #: choices per prompt (``n``, ``best_of``)
    max_choices: int = 256  #: engine sequences one request may start (prompts x n)
    max_connections: int = 1024  #: open connections; a request beyond them gets 503
    header_timeout: float = 10.0  #: seconds a connection may take to send a request's headers
    body_timeout: float = 30.0  #: seconds a request may take to send its body
    keep_alive_timeout: float = 5.0  #: seconds an idle keep-alive connection stays open
    shutdown_timeout: float = 30.0  #: seconds SIGTERM waits for requests in flight before cutting them
    parse_threads: int = 2  #: threads that parse, validate and tokenize requests

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None and f.name == "max_prompt_chars":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ValueError(f"{f.name}={value!r} must be a positive number")
            if f.type.startswith("int") and not isinstance(value, int):
                raise ValueError(f"{f.name}={value!r} must be an integer")
        if self.max_choices < self.max_n:
            raise ValueError(f"max_choices={self.max_choices} must be >= max_n={self.max_n}")

    def for_model(self, max_model_len: int) -> "ServerLimits":
        """These limits with ``max_prompt_chars`` resolved for a model of ``max_model_len`` tokens."""
        if self.max_prompt_chars is not None:
            return self
        return replace(self, max_prompt_chars=PROMPT_CHARS_PER_TOKEN * max_model_len)
