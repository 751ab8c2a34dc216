"""The text side of one request: incremental detokenization followed by stop-string holding.

Kept apart from ``llm_engine.py`` so the engine only asks "what text did this token release, and
did it hit a stop string?". Per token::

    token --> IncrementalDetokenizer --settled text--> StopScanner --released text--> client
                 (holds an incomplete UTF-8 char)        (holds a possible stop prefix)

Text held by either stage is never sent until it is decided; when the request ends for another
reason (end-of-sequence token, ``max_tokens``) both stages release what they hold, and a stop
string completed by that last text still cuts it (and the finish reason becomes "stop").
"""

from __future__ import annotations

from typing import Callable, Sequence

from atom.output.detokenizer import IncrementalDetokenizer
from atom.output.stop_strings import StopScanner, automaton_for

__all__ = ["RequestText"]


class RequestText:
    """Released text of one request; ``stops`` are its stop strings (may be empty); ``include_stop``
    keeps the stop string that matched at the end of the text."""

    __slots__ = ("_detok", "_scanner", "_pieces", "_stopped")

    def __init__(self, decode: Callable[[Sequence[int]], str], stops: tuple[str, ...],
                 include_stop: bool = False) -> None:
        self._detok = IncrementalDetokenizer(decode)
        self._scanner = StopScanner(automaton_for(stops), include_stop) if stops else None
        self._pieces: list[str] = []
        self._stopped = False

    def advance(self, token_id: int | None, final: bool) -> tuple[str, bool]:
        """Take this step's token (None: no new token) and whether the request has ended.

        Returns ``(new text to send, a stop string matched)``; after a match nothing more is
        released. ``final`` releases everything held (the request ended for another reason).
        """
        if self._stopped:
            return "", False
        settled = self._detok.push(token_id) if token_id is not None else ""
        if final:
            settled += self._detok.finish()
        released, stopped = self._scanner.feed(settled) if self._scanner is not None else (settled, False)
        if stopped:
            self._stopped = True
        elif final and self._scanner is not None:
            released += self._scanner.flush()
        if released:
            self._pieces.append(released)
        return released, stopped

    @property
    def stopped(self) -> bool:
        """A stop string matched (the text ends before it, or with it when ``include_stop``)."""
        return self._stopped

    def text(self) -> str:
        """Everything released so far (joined on demand: O(length), so call it once, at the end)."""
        if len(self._pieces) > 1:
            self._pieces = ["".join(self._pieces)]
        return self._pieces[0] if self._pieces else ""
