"""Connection-level defences under uvicorn: header timeout, connection cap, quiet accept errors.

uvicorn's own HTTP protocol has a keep-alive timeout but no limit on how long a connection may take
to send its request headers, and it accepts connections without bound, so thousands of half-open
connections (a slowloris, or clients that connect and never speak) hold file descriptors forever.
:func:`guarded_protocol` returns an h11 protocol class that

* closes a connection that has not sent complete request headers within ``header_timeout`` seconds
  of connecting or of its previous response (so dribbling one byte at a time does not help);
* answers ``503`` (OpenAI-style JSON) and closes when more than ``max_connections`` are open, so a
  flood costs one short write per connection -- except ``GET /health``: a liveness probe must not
  fail because clients fill the cap. A connection over the cap gets ``HEALTH_PROBE_WINDOW_S``
  seconds to send the start of its request line; if that is ``GET /health`` it is served, anything
  else (or nothing) gets the 503. At most ``HEALTH_PROBE_SLOTS`` connections wait so at once;
  beyond them the 503 is immediate;
* reports each refusal through ``on_reject(status)`` (the server counts it in ``/metrics``).

:class:`RateLimitedLoopErrors` is the event loop's exception handler: when the process runs out of
file descriptors, asyncio reports every failed ``accept()``; it logs at most ``burst`` of them per
``period`` seconds and then one line saying how many were suppressed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any, Callable

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

__all__ = ["guarded_protocol", "RateLimitedLoopErrors", "HEALTH_PROBE_WINDOW_S", "HEALTH_PROBE_SLOTS"]

HEALTH_PROBE_WINDOW_S = 0.2  #: seconds a connection over the cap has to show it is ``GET /health``
HEALTH_PROBE_SLOTS = 64  #: connections over the cap that may be waiting to show it at once
_HEALTH = b"GET /health"

log = logging.getLogger("atom.server")


def _refusal(status: int, reason: str, message: str) -> bytes:
    body = json.dumps({"error": {"message": message, "type": "server_error", "param": None,
                                 "code": "too_many_connections"}}).encode()
    head = (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n"
            "connection: close\r\n\r\n").encode()
    return head + body


def guarded_protocol(max_connections: int, header_timeout: float,
                     on_reject: Callable[[int], None] = lambda status: None) -> type[H11Protocol]:
    """An ``H11Protocol`` subclass enforcing the cap and the header timeout (see the module docstring)."""
    refusal = _refusal(503, "Service Unavailable",
                       f"the server has {max_connections} connections open, its limit; retry shortly")

    class GuardedH11Protocol(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None
        _probe: bytes | None = None  # over the cap: the bytes seen so far, until they show GET /health
        _probe_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            over = len(self.connections) - max_connections
            if over > HEALTH_PROBE_SLOTS:
                self._refuse()
            elif over > 0:
                self._probe = b""
                self._probe_timer = self.loop.call_later(HEALTH_PROBE_WINDOW_S, self._refuse)
            else:
                self._arm_header_timer()

        def data_received(self, data: bytes) -> None:
            if self._probe is None:
                return super().data_received(data)
            seen = self._probe + data
            if len(seen) <= len(_HEALTH):
                if _HEALTH.startswith(seen):
                    self._probe = seen  # so far so good: wait for more
                else:
                    self._refuse()
                return
            if not (seen.startswith(_HEALTH) and seen[len(_HEALTH):len(_HEALTH) + 1] in (b" ", b"?")):
                self._refuse()
                return
            self._end_probe()
            self._arm_header_timer()
            super().data_received(seen)

        def _refuse(self) -> None:
            self._end_probe()
            if not self.transport.is_closing():
                self.transport.write(refusal)
                self.transport.close()
                on_reject(503)

        def _end_probe(self) -> None:
            self._probe = None
            if self._probe_timer is not None:
                self._probe_timer.cancel()
                self._probe_timer = None

        def connection_lost(self, exc: Exception | None) -> None:
            self._end_probe()
            self._disarm_header_timer()
            super().connection_lost(exc)

        def handle_events(self) -> None:
            super().handle_events()
            if self.conn.their_state is not h11.IDLE:  # the request line and headers are in
                self._disarm_header_timer()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm_header_timer()

        def _arm_header_timer(self) -> None:
            self._disarm_header_timer()
            self._header_timer = self.loop.call_later(header_timeout, self._header_timed_out)

        def _disarm_header_timer(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _header_timed_out(self) -> None:
            self._header_timer = None
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self.transport.close()

    return GuardedH11Protocol


class RateLimitedLoopErrors:
    """An asyncio exception handler that logs at most ``burst`` reports per ``period`` seconds."""

    def __init__(self, burst: int = 5, period: float = 10.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.burst = burst
        self.period = period
        self._clock = clock
        self._window_start = -float("inf")
        self._logged = 0
        self.suppressed = 0

    def __call__(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        now = self._clock()
        if now - self._window_start >= self.period:
            if self.suppressed:
                log.error("atom: %d more event-loop errors like the above were not logged in the last %.0f s",
                          self.suppressed, now - self._window_start)
            self._window_start, self._logged, self.suppressed = now, 0, 0
        if self._logged < self.burst:
            self._logged += 1
            loop.default_exception_handler(context)
        else:
            self.suppressed += 1
