"""Stop strings matched on a rolling tail of the output text, in O(1) amortized per character.

A stop string may span several tokens, so the text that could still be the start of a stop must
not reach the client before the next tokens decide: it is *held back*. Checking every stop string
against the whole text at every token costs O(stops x length) per token; instead the stop strings
are compiled once into an Aho-Corasick automaton (:class:`StopAutomaton`, shared by every request
with the same stops) and each request keeps one state (:class:`StopScanner`)::

    text released so far | held                       held = the longest suffix of the text that is
    "The answer is 4"    | "\\n\\nQ"   (stop "\\n\\nQ:")     a prefix of some stop (the automaton
                                                        state's depth), never sent

Each character moves the state along the automaton's goto/failure links (amortized O(1)); the held
text is exactly the state's depth, so it is at most ``longest stop - 1`` characters.

Which stop wins: the text ends before the first stop string to *complete* in the stream (a
streaming server cannot wait for a later, earlier-starting match); among stops completing at the
same character the longest (earliest-starting) one. The released text never contains any prefix of
the stop that matched, because every such prefix was held.
"""

from __future__ import annotations

import functools
from collections import deque

__all__ = ["StopAutomaton", "StopScanner", "MarkerSplitter", "automaton_for"]


class StopAutomaton:
    """Aho-Corasick automaton of a set of non-empty stop strings (immutable after construction).

    State 0 is the root. ``depth[s]`` is the length of the text state ``s`` stands for;
    ``match[s]`` is the length of the longest stop string that is a suffix of it (0 = none).
    """

    __slots__ = ("goto", "fail", "depth", "match")

    def __init__(self, stops: tuple[str, ...]) -> None:
        assert stops and all(stops), "stop strings must be non-empty"
        self.goto: list[dict[str, int]] = [{}]
        self.depth = [0]
        self.match = [0]
        for stop in stops:
            self._insert(stop)
        self.fail = [0] * len(self.goto)
        self._link()

    def _insert(self, stop: str) -> None:
        s = 0
        for ch in stop:
            nxt = self.goto[s].get(ch)
            if nxt is None:
                nxt = len(self.goto)
                self.goto[s][ch] = nxt
                self.goto.append({})
                self.depth.append(self.depth[s] + 1)
                self.match.append(0)
            s = nxt
        self.match[s] = len(stop)

    def _link(self) -> None:
        """Breadth-first failure links; ``match`` inherits the failure state's match."""
        queue = deque(self.goto[0].values())
        while queue:
            s = queue.popleft()
            for ch, t in self.goto[s].items():
                f = self.fail[s]
                while f and ch not in self.goto[f]:
                    f = self.fail[f]
                self.fail[t] = self.goto[f].get(ch, 0)
                self.match[t] = max(self.match[t], self.match[self.fail[t]])
                queue.append(t)

    def step(self, state: int, ch: str) -> int:
        goto, fail = self.goto, self.fail
        while state and ch not in goto[state]:
            state = fail[state]
        return goto[state].get(ch, 0)


@functools.lru_cache(maxsize=64)
def automaton_for(stops: tuple[str, ...]) -> StopAutomaton:
    """The automaton of ``stops``, built once and shared (the ``n`` choices of a request share it)."""
    return StopAutomaton(stops)


class StopScanner:
    """One request's position in the stop automaton and the text it holds back.

    ``include_stop``: the text ends after the stop string that matched instead of before it (the
    holding is the same: a possible stop start is still not sent until it is decided)."""

    __slots__ = ("_auto", "_state", "_held", "_include")

    def __init__(self, automaton: StopAutomaton, include_stop: bool = False) -> None:
        self._auto = automaton
        self._state = 0
        self._held = ""
        self._include = include_stop

    def feed(self, text: str) -> tuple[str, bool]:
        """Scan ``text``; return ``(releasable text, stopped)``. After a stop, the text ends there."""
        if not text:
            return "", False
        auto, state = self._auto, self._state
        buf = self._held + text
        base = len(self._held)
        for i, ch in enumerate(text):
            state = auto.step(state, ch)
            if auto.match[state]:
                self._state, self._held = 0, ""
                return buf[: base + i + 1 - (0 if self._include else auto.match[state])], True
        self._state = state
        keep = auto.depth[state]
        self._held = buf[len(buf) - keep:] if keep else ""
        return buf[: len(buf) - keep], False

    def flush(self) -> str:
        """The output ended without a stop: release the held text."""
        held, self._held, self._state = self._held, "", 0
        return held


class MarkerSplitter:
    """Splits a text stream at marker strings, holding back a possible marker start like StopScanner.

    :meth:`feed` returns ``[(text, marker), ...]``: each piece of decided text followed by the marker
    that ended it, the last piece with ``None`` (text released, no marker yet). Used to split a chat
    answer into reasoning, content and tool-call blocks while it streams.
    """

    __slots__ = ("_auto", "_state", "_held")

    def __init__(self, markers: tuple[str, ...]) -> None:
        self._auto = automaton_for(markers)
        self._state = 0
        self._held = ""

    def feed(self, text: str) -> list[tuple[str, str | None]]:
        auto, state = self._auto, self._state
        buf, base, start, out = self._held + text, len(self._held), 0, []
        for i, ch in enumerate(text):
            state = auto.step(state, ch)
            if auto.match[state]:
                end = base + i + 1
                out.append((buf[start:end - auto.match[state]], buf[end - auto.match[state]:end]))
                start, state = end, 0
        keep = min(auto.depth[state], len(buf) - start)
        out.append((buf[start:len(buf) - keep], None))
        self._state, self._held = state, buf[len(buf) - keep:]
        return out

    def flush(self) -> str:
        held, self._held, self._state = self._held, "", 0
        return held
