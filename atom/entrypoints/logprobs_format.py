"""Log-probabilities in the two shapes of the OpenAI API.

``/v1/completions`` (legacy shape)::

    {"tokens": [str], "token_logprobs": [float], "top_logprobs": [{str: float}] | null,
     "text_offset": [int]}

``/v1/chat/completions``::

    {"content": [{"token": str, "logprob": float, "bytes": [int],
                  "top_logprobs": [{"token": str, "logprob": float, "bytes": [int]}]}], "refusal": null}

A token's string is its bytes decoded as UTF-8 with U+FFFD for an incomplete character (a byte-level
token may hold part of one); ``bytes`` gives the exact bytes. ``text_offset`` counts characters of
those token strings from the start of the completion (after an echoed prompt).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:
    from atom.output.request_output import TokenLogprobs
    from atom.tokenizer import Tokenizer

__all__ = ["completion_logprobs", "chat_logprobs"]


def _text(tok: "Tokenizer", token_id: int) -> tuple[str, bytes]:
    raw = tok.token_bytes(token_id)
    return raw.decode("utf-8", "replace"), raw


def completion_logprobs(tok: "Tokenizer", entries: Sequence["TokenLogprobs"], top: int,
                        offset: int) -> tuple[dict[str, Any], int]:
    """The completions ``logprobs`` object of ``entries`` starting at character ``offset``, and the
    offset after them (for the next streamed chunk)."""
    tokens, values, tops, offsets = [], [], [], []
    for e in entries:
        text, _ = _text(tok, e.token_id)
        tokens.append(text)
        values.append(e.logprob)
        offsets.append(offset)
        offset += len(text)
        alternatives: dict[str, float] = {}
        for i, lp in e.top:  # two tokens may share a string (bytes of one character): keep the likelier
            alternatives.setdefault(_text(tok, i)[0], lp)
        tops.append(alternatives)
    return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops if top > 0 else None,
            "text_offset": offsets}, offset


def chat_logprobs(tok: "Tokenizer", entries: Sequence["TokenLogprobs"]) -> dict[str, Any]:
    """The chat ``logprobs`` object of ``entries``."""
    content = []
    for e in entries:
        text, raw = _text(tok, e.token_id)
        alternatives = []
        for i, lp in e.top:
            alt_text, alt_raw = _text(tok, i)
            alternatives.append({"token": alt_text, "logprob": lp, "bytes": list(alt_raw)})
        content.append({"token": text, "logprob": e.logprob, "bytes": list(raw), "top_logprobs": alternatives})
    return {"content": content, "refusal": None}
