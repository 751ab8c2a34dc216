"""Feeding a request's tokens through its :class:`~atom.output.request_text.RequestText` as the engine does."""

from __future__ import annotations

from atom.output.request_text import RequestText


def stream_text(text: RequestText, ids: list[int]) -> tuple[list[str], bool]:
    """``(pieces sent, stopped)``: ``ids`` advanced one by one (the last one final) until a stop string ends
    the text."""
    sent, stopped = [], False
    for k, t in enumerate(ids):
        piece, stopped = text.advance(t, final=k == len(ids) - 1)
        sent.append(piece)
        if stopped:
            break
    return sent, stopped
