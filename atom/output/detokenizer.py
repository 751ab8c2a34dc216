"""Incremental detokenization: the text of one request's output, a token at a time, in O(1) per token.

Decoding the whole output at every step costs O(length) per token. Instead,
:class:`IncrementalDetokenizer` decodes only a short *window* of the latest tokens and remembers how
many characters of that window's text it has already released::

    output ids   t0 t1 t2 ... t_k | t_k+1 ... t_n          (window = ids from t_k+1, at most ~2*CONTEXT)
    window text  "....released....|held"                   released: handed to the caller, final
                                                           held: trailing U+FFFD that may still change

Why a window still decodes right: a tokenizer's decoder is local -- appending tokens only changes the
last few characters (an incomplete UTF-8 character at the end, which decodes to U+FFFD until its
last byte arrives) and a token's text can depend on its left neighbour (a leading-space marker is
dropped only at the start of a decode). The window therefore always keeps ``CONTEXT`` tokens before
the newest text, and it is only shortened when the shorter window's text is an exact suffix of the
longer one's (a clean split), so the released count carries over.

Held text: at most :data:`MAX_HELD` trailing U+FFFD characters, the most an incomplete UTF-8
character can produce (one per byte with byte-fallback decoders, one in all with byte-level ones).
Earlier U+FFFD are final (the bytes were invalid) and are released. On :meth:`finish` everything is
released, so the concatenation of all released pieces equals ``decode(all ids)``.
"""

from __future__ import annotations

from typing import Callable, Sequence

__all__ = ["IncrementalDetokenizer", "CONTEXT", "MAX_HELD"]

#: Tokens of left context the window keeps after it shortens.
CONTEXT = 4
#: Most trailing U+FFFD characters held back while the output may still complete a character.
MAX_HELD = 3
_REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    """Released text of a growing token sequence. ``decode(ids) -> str`` is the tokenizer's decode.

    Contract: ``"".join(pieces)`` over every :meth:`push` and the final :meth:`finish` equals
    ``decode(all ids)`` for decoders that are local as described in the module docstring (byte-level
    and byte-fallback BPE, SentencePiece); each call decodes at most ``2 * CONTEXT + MAX_HELD`` tokens
    in the usual case, so the cost per token does not grow with the output.
    """

    __slots__ = ("_decode", "_window", "_sent")

    def __init__(self, decode: Callable[[Sequence[int]], str]) -> None:
        self._decode = decode
        self._window: list[int] = []
        self._sent = 0  # characters of decode(self._window) already released

    def push(self, token_id: int) -> str:
        """Add one token; return the text it settled (possibly empty)."""
        self._window.append(token_id)
        return self._release(final=False)

    def finish(self) -> str:
        """No more tokens: release whatever is held (a trailing incomplete character as U+FFFD)."""
        return self._release(final=True)

    def _release(self, final: bool) -> str:
        text = self._decode(self._window)
        settled = len(text) if final else len(text) - _held_count(text)
        out = text[self._sent:settled] if settled > self._sent else ""
        self._sent = max(self._sent, settled)
        if len(self._window) >= 2 * CONTEXT:
            self._shorten(text)
        return out

    def _shorten(self, text: str) -> None:
        """Drop all but the last CONTEXT tokens when that split is clean and fully released."""
        tail_ids = self._window[-CONTEXT:]
        tail = self._decode(tail_ids)
        head_len = len(text) - len(tail)
        if text.endswith(tail) and self._sent >= head_len:
            self._window = list(tail_ids)
            self._sent -= head_len


def _held_count(text: str) -> int:
    n = 0
    while n < MAX_HELD and n < len(text) and text[-1 - n] == _REPLACEMENT:
        n += 1
    return n
