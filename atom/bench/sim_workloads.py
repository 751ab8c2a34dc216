"""Seeded synthetic workloads for the trace simulator (no downloads).

A trace is a tuple of :class:`Session` objects. A session is one or more :class:`Turn` objects; a
one-shot request is a session of one turn. The first turn's prompt is the concatenation of its
segments; every later turn's prompt is the previous turn's *whole* sequence as it finished (prompt
plus the tokens the runner actually generated) followed by the turn's new segments. So a multi-turn
session only becomes concrete while it runs, and its reuse of the previous answer is real.

Token content comes from :class:`Segment` keys: equal keys give equal tokens (a shared system
prompt, a re-read document), different keys give unrelated random tokens. All randomness (lengths,
arrivals, keys) comes from ``numpy.random.default_rng(seed)``, so a (workload, scale, seed) triple
always gives the same trace.

Workloads (counts at ``scale=1``; rates in sessions per modelled second, Poisson arrivals):

- ``chat``: 800 requests, prompts lognormal (median 600, 32..4096), answers lognormal (median 250,
  16..2048), 40/s.
- ``long``: 48 requests, each a document of 32K..256K tokens (log-uniform) plus a 32..256-token
  question, answers 64..512; half the requests re-read one of the 8 most recent documents
  (document QA), 0.2/s.
- ``agentic``: 64 sessions of 5..20 turns; turn 1 = a 4096-token agent system prompt shared by
  every session + a 256..2048-token task; each later turn re-sends the history plus 100..600 new
  tokens (tool output / user message) after an exponential think time (mean 2 s); answers
  50..500; 2 sessions/s.
- ``sysprompt``: 800 requests = one 4096-token system prompt + a 32..512-token unique suffix,
  answers 32..512, 40/s.
- ``mix``: a quarter of each of the above (counts and rates), on one timeline.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Callable, Sequence as Seq

import numpy as np

__all__ = ["VOCAB", "Segment", "Turn", "Session", "WORKLOADS", "build_trace", "segment_tokens",
           "first_prompt", "request_id", "MAX_TURNS"]

VOCAB = 129280  # DeepSeek-V4 vocabulary size: user tokens and fake-runner tokens share this range
MAX_TURNS = 32  # request id = session id * MAX_TURNS + turn index


@dataclass(frozen=True)
class Segment:
    """``length`` tokens whose content is determined by ``key`` alone."""

    key: int
    length: int


@dataclass(frozen=True)
class Turn:
    """New tokens of one turn, the answer length, and the delay after the previous turn ended."""

    new: tuple[Segment, ...]
    max_tokens: int
    think_s: float = 0.0


@dataclass(frozen=True)
class Session:
    """A conversation: ``turns[0]`` arrives at ``arrival``; later turns follow their predecessor."""

    sid: int
    kind: str
    arrival: float
    turns: tuple[Turn, ...]

    def __post_init__(self) -> None:
        if not 1 <= len(self.turns) <= MAX_TURNS:
            raise ValueError(f"session {self.sid}: {len(self.turns)} turns, must be 1..{MAX_TURNS}")


def request_id(sid: int, turn: int) -> int:
    """The scheduler id of a turn; fixed by the trace so the fake runner's tokens are too."""
    return sid * MAX_TURNS + turn


@lru_cache(maxsize=8)
def _segment_array(key: int, length: int) -> tuple[int, ...]:
    return tuple(np.random.default_rng(key).integers(0, VOCAB, length).tolist())


def segment_tokens(seg: Segment) -> tuple[int, ...]:
    """The token ids of a segment (deterministic in its key and length)."""
    return _segment_array(seg.key, seg.length)


def first_prompt(turn: Turn) -> list[int]:
    out: list[int] = []
    for seg in turn.new:
        out.extend(segment_tokens(seg))
    return out


def turn_prompt(turn: Turn, previous: Seq[int] | None) -> list[int]:
    """A turn's prompt: its segments, after the previous turn's whole sequence if there is one."""
    if previous is None:
        return first_prompt(turn)
    tokens = list(previous)
    for seg in turn.new:
        tokens.extend(segment_tokens(seg))
    return tokens


def pop_arrival(pending: list[tuple[float, int, int]], by_sid: dict[int, Session],
                live: dict[int, tuple[Any, int, int]]) -> tuple[int, int, int, Turn, list[int]]:
    """Take the earliest turn off the ``pending`` heap of ``(arrival, request id, session id)``:
    ``(rid, sid, turn index, turn, prompt)``. The previous turn of its session leaves ``live``
    (``rid -> (sequence, sid, turn index)``) and its whole sequence starts the prompt."""
    _, rid, sid = heapq.heappop(pending)
    turn_idx = rid - request_id(sid, 0)
    turn = by_sid[sid].turns[turn_idx]
    prev = live.pop(request_id(sid, turn_idx - 1), None) if turn_idx else None
    return rid, sid, turn_idx, turn, turn_prompt(turn, None if prev is None else prev[0].token_ids)


def finish_turn(pending: list[tuple[float, int, int]], by_sid: dict[int, Session],
                live: dict[int, tuple[Any, int, int]], rid: int, t: float) -> int:
    """Turn ``rid`` finished at ``t``: its session's next turn joins ``pending`` after its think time (the
    finished sequence stays in ``live`` to start that turn's prompt), or the session ends and it leaves
    ``live``. Returns the finished sequence's token count."""
    seq, sid, turn_idx = live[rid]
    sess = by_sid[sid]
    if turn_idx + 1 < len(sess.turns):
        heapq.heappush(pending, (t + sess.turns[turn_idx + 1].think_s, request_id(sid, turn_idx + 1), sid))
    else:
        live.pop(rid)
    return len(seq.token_ids)


def _lognormal(rng: np.random.Generator, median: float, sigma: float, lo: int, hi: int) -> int:
    return int(np.clip(round(median * float(np.exp(sigma * rng.standard_normal()))), lo, hi))


def _arrivals(rng: np.random.Generator, n: int, rate: float, start: float = 0.0) -> np.ndarray:
    return start + np.cumsum(rng.exponential(1.0 / rate, n))


class _Keys:
    """Fresh segment keys (distinct from each other and from fixed shared keys)."""

    def __init__(self, rng: np.random.Generator) -> None:
        self.rng = rng

    def __call__(self) -> int:
        return int(self.rng.integers(1 << 40, 1 << 62))


_SYSTEM_KEY = 7  # the shared system prompt of ``sysprompt``
_AGENT_KEY = 11  # the shared agent system prompt of ``agentic``


def chat(n: int, rate: float, seed: int, sid0: int = 0) -> list[Session]:
    rng = np.random.default_rng(seed)
    key, times = _Keys(rng), _arrivals(rng, n, rate)
    return [Session(sid0 + i, "chat", float(times[i]),
                    (Turn((Segment(key(), _lognormal(rng, 600, 0.8, 32, 4096)),), _lognormal(rng, 250, 0.8, 16, 2048)),))
            for i in range(n)]


def long_context(n: int, rate: float, seed: int, sid0: int = 0) -> list[Session]:
    rng = np.random.default_rng(seed)
    key, times = _Keys(rng), _arrivals(rng, n, rate)
    docs: list[Segment] = []
    out = []
    for i in range(n):
        if docs and rng.random() < 0.5:
            doc = docs[int(rng.integers(max(0, len(docs) - 8), len(docs)))]
        else:
            doc = Segment(key(), int(round(np.exp(rng.uniform(np.log(32768), np.log(262144))))))
            docs.append(doc)
        question = Segment(key(), int(rng.integers(32, 257)))
        out.append(Session(sid0 + i, "long", float(times[i]), (Turn((doc, question), int(rng.integers(64, 513))),)))
    return out


def agentic(n: int, rate: float, seed: int, sid0: int = 0) -> list[Session]:
    rng = np.random.default_rng(seed)
    key, times = _Keys(rng), _arrivals(rng, n, rate)
    system = Segment(_AGENT_KEY, 4096)
    out = []
    for i in range(n):
        turns = [Turn((system, Segment(key(), int(rng.integers(256, 2049)))), int(rng.integers(50, 501)))]
        for _ in range(int(rng.integers(5, 21)) - 1):
            turns.append(Turn((Segment(key(), int(rng.integers(100, 601))),), int(rng.integers(50, 501)),
                              float(rng.exponential(2.0))))
        out.append(Session(sid0 + i, "agentic", float(times[i]), tuple(turns)))
    return out


def sysprompt(n: int, rate: float, seed: int, sid0: int = 0) -> list[Session]:
    rng = np.random.default_rng(seed)
    key, times = _Keys(rng), _arrivals(rng, n, rate)
    system = Segment(_SYSTEM_KEY, 4096)
    return [Session(sid0 + i, "sysprompt", float(times[i]),
                    (Turn((system, Segment(key(), int(rng.integers(32, 513)))), int(rng.integers(32, 513))),))
            for i in range(n)]


Generator = Callable[[int, float, int, int], list[Session]]
# name -> (generator, sessions at scale 1, arrival rate per modelled second)
_BASE: dict[str, tuple[Generator, int, float]] = {
    "chat": (chat, 800, 40.0),
    "long": (long_context, 48, 0.2),
    "agentic": (agentic, 64, 2.0),
    "sysprompt": (sysprompt, 800, 40.0),
}
WORKLOADS = (*_BASE, "mix")


def build_trace(name: str, scale: float = 1.0, seed: int = 0, rate_scale: float = 1.0) -> tuple[Session, ...]:
    """The sessions of workload ``name`` at ``scale`` x the default counts and ``rate_scale`` x the
    default arrival rates, sorted by arrival.

    ``mix`` = a quarter of each base workload (counts and rates), each from its own sub-seed, with
    distinct session ids, merged on one timeline. Raises ``ValueError`` on an unknown name or a
    scale that leaves no session.
    """
    if name not in WORKLOADS:
        raise ValueError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}")
    if not (scale > 0 and rate_scale > 0):
        raise ValueError(f"scale={scale} and rate_scale={rate_scale} must be > 0")
    parts = list(_BASE) if name == "mix" else [name]
    share = 0.25 if name == "mix" else 1.0
    sessions: list[Session] = []
    for idx, part in enumerate(parts):
        gen, n, rate = _BASE[part]
        count = max(1, round(n * scale * share))
        sessions += gen(count, rate * share * rate_scale, seed * 1000 + idx, len(sessions))
    return tuple(sorted(sessions, key=lambda s: (s.arrival, s.sid)))
