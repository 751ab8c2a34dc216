"""Large request bodies are decoded and checked in a helper process first, never under this process's lock.

``json.loads`` of a 4 MB body of small values (a million token ids, 300,000 stop strings) is one C
call of 15-50 ms that holds the interpreter lock, and so does validating what it returns: for that
long the engine thread cannot run a step and the event loop cannot answer ``/health``, whatever
thread the parsing runs on. So a body of at least ``PRECHECK_BYTES`` is first run through
:func:`~atom.entrypoints.request_parse.parse_body` -- decoding, every limit, validation -- in a
separate process, and only the verdict comes back. A body it refuses is never decoded in the server
process; a body it accepts is decoded again there (it passed every limit, so what that costs is the
cost of work the server takes on anyway).

The helpers run at a lower CPU priority (``HELPER_NICENESS`` above the server's), so on a machine with
few cores the engine's steps keep their share while a hostile body is decoded: the request that
brought the large body waits, not the others.

If a helper process dies (or cannot start: ``spawn`` re-imports the main module, which a program
read from stdin does not have), that request is checked in-process only (``parse_body`` still applies
every limit) and the helpers are not tried again: one warning, then the server parses every body
in-process, as it does small ones.
"""

from __future__ import annotations

import concurrent.futures
import logging
import multiprocessing
import os
import threading
import time
from concurrent.futures.process import BrokenProcessPool

from pydantic import BaseModel

from atom.entrypoints.limits import ServerLimits
from atom.entrypoints.protocol import ApiError, ChatCompletionRequest, CompletionRequest
from atom.entrypoints.request_parse import parse_body

__all__ = ["BodyPrecheck", "PRECHECK_BYTES"]

log = logging.getLogger("atom.server")

#: Bodies from this size on are checked in the helper process (smaller ones decode in well under 1 ms).
PRECHECK_BYTES = 256 * 1024

#: How much lower (``os.nice`` increment) the helpers' CPU priority is than the server's.
HELPER_NICENESS = 10

_Verdict = tuple[int, str, str, "str | None", "str | None"]  # ApiError's status, message, type, param, code


#: How often (seconds) a helper checks that the server that started it is still alive.
PARENT_POLL_S = 0.5


def _start_helper(server_pid: int) -> None:
    """Helper start-up: yield the CPU to the server's threads when both want it, and end when the
    server ends. A server that leaves by ``os._exit`` (a dead tensor-parallel rank takes it down that
    way) never shuts its pool down, and a ``spawn`` helper holds both ends of its task queue, so it
    would otherwise wait forever, keeping the server's stdout open."""
    os.nice(HELPER_NICENESS)
    threading.Thread(target=_exit_with_server, args=(server_pid,), name="atom-precheck-watch",
                     daemon=True).start()


def _exit_with_server(server_pid: int) -> None:
    while os.getppid() == server_pid:
        time.sleep(PARENT_POLL_S)
    os._exit(0)


def _verdict(raw: bytes, chat: bool, limits: ServerLimits, max_model_len: int) -> _Verdict | None:
    """In the helper process: None when ``raw`` passes ``parse_body``, else its error's fields."""
    try:
        parse_body(raw, ChatCompletionRequest if chat else CompletionRequest, limits, max_model_len)
    except ApiError as exc:
        return exc.status, exc.message, exc.type, exc.param, exc.code
    except Exception:  # not the helper's to answer: the in-process parse meets it again and decides
        return None
    return None


class BodyPrecheck:
    """The helper processes (``limits.parse_threads`` of them, started by :meth:`warm` or on the first
    large body)."""

    def __init__(self, limits: ServerLimits, max_model_len: int, min_bytes: int = PRECHECK_BYTES) -> None:
        self.limits = limits
        self.max_model_len = max_model_len
        self.min_bytes = min_bytes
        self._lock = threading.Lock()
        self._pool: concurrent.futures.ProcessPoolExecutor | None = None
        self._closed = False

    def check(self, raw: bytes, model: type[BaseModel]) -> None:
        """Raise the :class:`ApiError` ``parse_body`` would raise for ``raw``, computed in the helper
        when ``raw`` is large; return None when it passes (or is small). Call from a parse thread."""
        if len(raw) < self.min_bytes:
            return
        pool = self._get_pool()
        if pool is None:
            return
        chat = "messages" in model.model_fields
        try:
            verdict = pool.submit(_verdict, raw, chat, self.limits, self.max_model_len).result()
        except (BrokenProcessPool, RuntimeError) as exc:  # the helper died, or the pool is shutting down
            if self._disable(pool):
                log.warning("atom: the body-check process failed (%r); large bodies are checked in-process "
                            "from now on", exc)
            return
        if verdict is not None:
            status, message, type_, param, code = verdict
            raise ApiError(status, message, type=type_, param=param, code=code)

    def warm(self) -> None:
        """Start the helper processes now (a server does, so its first large body does not pay for
        starting an interpreter while other requests stream)."""
        pool = self._get_pool()
        if pool is not None:
            for _ in range(self.limits.parse_threads):
                pool.submit(_verdict, b"{}", False, self.limits, self.max_model_len)

    def close(self) -> None:
        """Stop the helper processes (requests still waiting for a verdict fall back to in-process)."""
        with self._lock:
            self._closed = True
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def _get_pool(self) -> concurrent.futures.ProcessPoolExecutor | None:
        with self._lock:
            if self._pool is None and not self._closed:
                self._pool = concurrent.futures.ProcessPoolExecutor(
                    max_workers=self.limits.parse_threads, mp_context=multiprocessing.get_context("spawn"),
                    initializer=_start_helper, initargs=(os.getpid(),))
            return self._pool

    def _disable(self, pool: concurrent.futures.ProcessPoolExecutor) -> bool:
        """Stop using helper processes; True the first time (so the caller warns once)."""
        with self._lock:
            first = not self._closed
            self._closed = True
            self._pool = None
        pool.shutdown(wait=False, cancel_futures=True)
        return first
