"""Which attention replica a new request goes to (data-parallel attention; pure Python, on rank 0).

Each replica has its own scheduler, block manager and arena, so a prefix cached on one replica is a
miss on every other. The router asks each replica, through a :class:`ReplicaView`, how many tokens
of the prompt its prefix cache holds now (a read-only walk of its prefix index), how much of its
arena is free and how many prompt tokens wait in its queue, and picks one by its policy:

- ``prefix`` (default): the replica with the most cached prefix tokens of the prompt less its load,
  the tokens of its running and queued requests: among equally loaded replicas the longest cached
  prefix wins, and a longer prefix wins over a less loaded replica when it saves more tokens than
  the load difference. A tie (a miss everywhere on equally loaded replicas) goes to the most free arena,
  then the fewest waiting tokens, then the lowest index. A request that names a session (the
  OpenAI ``user`` field, or a session id) is sticky: once routed, the session's later requests go
  back to the same replica, where its earlier turns are cached, whatever the other replicas hold.

  Why the load term: a cached token saves one token of prefill and of KV on that replica, a running
  or queued token is one the request would share the replica's steps and arena with. Longest prefix
  alone sends every new session that starts with a shared system prompt to the one replica that
  cached it first, and sticky sessions then keep them there: on the simulator's agentic trace, 4
  replicas, 731 of 752 requests went to one replica (``docs/parallelism.md``). Queued tokens count
  too, or requests arriving between two steps all go to the replica that ran least.
- ``least-loaded``: the most free arena, then the fewest waiting tokens, then the lowest index
  (cache-blind, as the routers of other engines).
- ``round-robin``: replicas in turn, whatever they hold.

Sessions are sticky under ``prefix`` only: the two other policies are the cache-blind baselines.
The session table keeps the ``max_sessions`` most recently routed sessions (least recently routed
forgotten first), so it stays bounded on a server that never calls :meth:`ReplicaRouter.forget`.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Protocol, Sequence

if TYPE_CHECKING:
    from atom.model_engine.scheduler import Scheduler

__all__ = ["POLICIES", "ReplicaView", "ReplicaRouter", "SchedulerView"]

POLICIES = ("prefix", "least-loaded", "round-robin")


class ReplicaView(Protocol):
    """What the router reads of one replica; every call is read only."""

    def cached_prefix_tokens(self, token_ids: Sequence[int]) -> int:
        """Tokens of this prompt the replica's prefix cache holds now (what admission would reuse)."""
        ...

    def free_arena_bytes(self) -> int:
        """Bytes of the replica's arena no owner holds (free chunks x chunk bytes)."""
        ...

    def waiting_tokens(self) -> int:
        """Tokens of the requests queued on the replica, not yet admitted."""
        ...

    def running_tokens(self) -> int:
        """Tokens (prompt and output so far) of the requests running on the replica."""
        ...


class SchedulerView:
    """The :class:`ReplicaView` of one replica's :class:`Scheduler` over a chunked arena
    (:class:`~atom.kv.unified_kv_arena.UnifiedKvArena`)."""

    __slots__ = ("scheduler",)

    def __init__(self, scheduler: Scheduler) -> None:
        self.scheduler = scheduler

    def cached_prefix_tokens(self, token_ids: Sequence[int]) -> int:
        return self.scheduler.bm.cached_prefix_tokens(token_ids)

    def free_arena_bytes(self) -> int:
        arena = self.scheduler.bm.arena
        return arena.num_free_chunks() * arena.layout.chunk_bytes

    def waiting_tokens(self) -> int:
        return self.scheduler.waiting_tokens()

    def running_tokens(self) -> int:
        return sum(len(seq) for seq in self.scheduler.running)


class ReplicaRouter:
    """Routes each new request to one of the replicas by ``policy`` (one of :data:`POLICIES`)."""

    def __init__(self, policy: str = "prefix", max_sessions: int = 1 << 16) -> None:
        if policy not in POLICIES:
            raise ValueError(f"unknown router policy {policy!r}; accepted: {', '.join(POLICIES)}")
        if max_sessions < 1:
            raise ValueError(f"max_sessions must be >= 1, got {max_sessions}")
        self.policy = policy
        self.max_sessions = max_sessions
        self._next = 0  # round-robin: the replica the next request goes to
        self._sessions: OrderedDict[str, int] = OrderedDict()  # session -> its replica (prefix policy)

    def route(self, token_ids: Sequence[int], replicas: Sequence[ReplicaView], session: str | None = None) -> int:
        """The index in ``replicas`` of the replica the request with prompt ``token_ids`` (and
        ``session``, if it names one) goes to. ``ValueError`` for an empty replica list or an empty prompt."""
        if not replicas:
            raise ValueError("route needs at least one replica")
        if not token_ids:
            raise ValueError("route needs a prompt of at least one token")
        if self.policy == "round-robin":
            chosen = self._next % len(replicas)
            self._next = chosen + 1
            return chosen
        if self.policy == "least-loaded":
            return self._least_loaded(replicas, range(len(replicas)))
        if session is not None:
            known = self._sessions.get(session)
            if known is not None and known < len(replicas):
                self._sessions.move_to_end(session)
                return known
        chosen = self._longest_prefix(token_ids, replicas)
        if session is not None:
            self._remember(session, chosen)
        return chosen

    def forget(self, session: str) -> None:
        """Drop ``session``'s replica (its next request is routed afresh); unknown sessions are ignored."""
        self._sessions.pop(session, None)

    def session_replica(self, session: str) -> int | None:
        """The replica ``session`` is bound to, or None."""
        return self._sessions.get(session)

    # ---- policies -----------------------------------------------------------------------------
    def _longest_prefix(self, token_ids: Sequence[int], replicas: Sequence[ReplicaView]) -> int:
        """The most cached prefix tokens less running and queued tokens; ties by :meth:`_least_loaded`."""
        gains = [r.cached_prefix_tokens(token_ids) - r.running_tokens() - r.waiting_tokens() for r in replicas]
        best = max(gains)
        return self._least_loaded(replicas, [d for d, gain in enumerate(gains) if gain == best])

    @staticmethod
    def _least_loaded(replicas: Sequence[ReplicaView], candidates: Sequence[int]) -> int:
        """Among ``candidates``: the most free arena, then the fewest waiting tokens, then the lowest index."""
        return min(candidates, key=lambda d: (-replicas[d].free_arena_bytes(), replicas[d].waiting_tokens(), d))

    def _remember(self, session: str, replica: int) -> None:
        self._sessions[session] = replica
        self._sessions.move_to_end(session)
        while len(self._sessions) > self.max_sessions:
            self._sessions.popitem(last=False)
