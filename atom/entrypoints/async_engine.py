"""The engine's background loop: continuous batching in one thread, fed by the asyncio server.

``LLMEngine`` is single-threaded, so exactly one thread (started by :meth:`AsyncEngine.start`)
touches it. Everything else talks to that thread through a command queue::

    event loop (routes)                            engine thread
    -------------------                            -------------
    group.add_all() --("add", [(rid, ids, params)...], session)--> add_request() each --accepted / ValueError--> future
    group.outputs() <--outputs, call_soon_threadsafe--  step() while work exists
    abort()     --("abort", rid)-------------->    abort_request()
    call(fn)    --("call", fn)---------------->    fn(engine)     --result / exception--> future

The thread steps while any request is unfinished and otherwise sleeps on a condition variable
until a command arrives. When the engine goes idle it runs ``check_integrity()`` (the invariant
check of STYLE rule 12); a failure there, or an exception from ``step()``, fails the requests in
flight with an internal error, aborts them in the engine and marks the server unhealthy
(``/health`` answers 503) -- it never silently continues with a corrupt arena.

A :class:`RequestGroup` gathers the requests of one HTTP call (``n`` choices, several prompts)
behind one output queue. It is admitted by ONE command (so a request of 256 prompts enters the
engine between two steps, not one per step) and aborted as one: the requests it added, waiting or
running, all go. Under data-parallel attention the choices of one prompt are placed together
(``place_with``: they share the prompt, so they share one replica's prefix cache) and the group's
``session`` (the request's ``user``) keeps a user's requests on one replica.

On shutdown, :meth:`AsyncEngine.close_groups` ends every open group with a
:class:`ServerStoppingError`, so a stream can say why it ends instead of being cut. Contract of
:meth:`AsyncEngine.generate` (a group of one): it raises ``ValueError`` (before yielding anything) when
the engine rejects the request, then yields each :class:`RequestOutput` of that request in order;
the last has ``finished=True``. Leaving the iterator early (client gone, task cancelled) aborts the
request, so its KV memory goes back to the arena.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import logging
import threading
import traceback
import weakref
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable

from atom.sampling_params import SamplingParams

if TYPE_CHECKING:
    from atom.model_engine.dp_engine import DataParallelEngine
    from atom.model_engine.llm_engine import LLMEngine

    Engine = LLMEngine | DataParallelEngine
    from atom.output.request_output import RequestOutput

__all__ = ["AsyncEngine", "RequestGroup", "EngineDeadError", "ServerStoppingError"]

log = logging.getLogger("atom.server")


class EngineDeadError(RuntimeError):
    """The engine thread failed; requests in flight get this and the server reports unhealthy."""


class ServerStoppingError(RuntimeError):
    """The server is shutting down and its grace period for requests in flight is over."""


_CLOSED = object()  # queued by RequestGroup.abort: ends an outputs() iteration that is waiting


class RequestGroup:
    """The requests of one HTTP call (its ``n`` choices, its prompts): one queue, one abort.

    Created by :meth:`AsyncEngine.group` on the event loop. :meth:`add_all` its requests (one
    engine command; raises ``ValueError`` if the engine rejects one, and then none of them stays),
    then iterate :meth:`outputs`: it yields every output of every added request, in engine order,
    until all have finished. Leaving the iteration early, or calling :meth:`abort`, aborts whatever
    has not finished and ends an iteration that is waiting.
    """

    def __init__(self, engine: "AsyncEngine", loop: asyncio.AbstractEventLoop) -> None:
        self._engine = engine
        self._loop = loop
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self.unfinished: set[str] = set()

    def put(self, item: Any) -> None:
        """Thread-safe: called from the engine thread with an output or an exception."""
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the event loop is closed: nobody is listening any more
            pass

    async def add(self, prompt_ids: list[int], params: SamplingParams, request_id: str) -> None:
        """Add one request (see :meth:`add_all`)."""
        await self.add_all([(request_id, prompt_ids, params)])

    async def add_all(self, requests: list[tuple[str, list[int], SamplingParams]], session: str | None = None) -> None:
        """Add ``(request_id, prompt_ids, params)`` requests in one engine command (``session``: see
        the module docstring). If the engine rejects one, none of them stays and its ``ValueError`` is
        raised; if the caller is cancelled meanwhile, all of them are aborted."""
        if self._engine.dead_reason is not None:
            raise EngineDeadError(self._engine.dead_reason)
        accepted: asyncio.Future[None] = self._loop.create_future()
        rids = [rid for rid, _, _ in requests]
        self.unfinished.update(rids)
        self._engine._send("add", requests, self, accepted, session)
        try:
            await accepted  # raises ValueError if the engine rejects a request
        except asyncio.CancelledError:
            self.abort()
            raise
        except BaseException:
            self.unfinished.difference_update(rids)
            raise

    async def outputs(self) -> AsyncIterator["RequestOutput"]:
        """Every output of the group's requests, then the end; raises what :meth:`fail` was given, even
        when it came while this iteration was suspended at a ``yield`` (:meth:`fail` empties
        ``unfinished`` at once, so the queue is read until it is empty, not only while requests are
        unfinished: a stream cut at shutdown ends with its error, not as if it had completed)."""
        try:
            while self.unfinished or not self._queue.empty():
                item = await self._queue.get()
                if item is _CLOSED:
                    break
                if isinstance(item, BaseException):
                    raise item
                if item.finished:
                    self.unfinished.discard(item.request_id)
                yield item
        finally:
            self.abort()

    def abort(self) -> None:
        """Abort every request of the group that has not finished (no-op when none), in one engine
        command; an :meth:`outputs` iteration waiting for more ends. Event loop only."""
        if self.unfinished:
            self._engine._send("abort", tuple(self.unfinished))
            self.unfinished.clear()
            self._queue.put_nowait(_CLOSED)

    def fail(self, exc: BaseException) -> None:
        """End the group with ``exc``: :meth:`outputs` raises it; the unfinished requests are aborted."""
        if self.unfinished:
            self._queue.put_nowait(exc)
            self.abort()


class AsyncEngine:
    """Owns the engine thread; the only way the server reaches the engine (``LLMEngine``, or
    ``DataParallelEngine`` under data-parallel attention: the same API)."""

    def __init__(self, engine: "Engine", *, integrity_check_when_idle: bool = True) -> None:
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.model_name = engine.model_name
        self.max_model_len = engine.max_model_len
        self._check_when_idle = integrity_check_when_idle
        self._commands: collections.deque[tuple[Any, ...]] = collections.deque()
        self._wake = threading.Condition()
        self._streams: dict[str, RequestGroup] = {}  # engine thread only
        self._thread: threading.Thread | None = None
        self._groups: "weakref.WeakSet[RequestGroup]" = weakref.WeakSet()  # event loop only
        self._stopping = False
        self.dead_reason: str | None = None

    # ---- lifecycle ----------------------------------------------------------------------------
    def start(self) -> None:
        assert self._thread is None, "AsyncEngine.start() called twice"
        self._thread = threading.Thread(target=self._run, name="atom-engine", daemon=True)
        self._thread.start()

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the thread after its current step; unfinished requests are aborted."""
        with self._wake:
            self._stopping = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def healthy(self) -> bool:
        return self.dead_reason is None and self._thread is not None and self._thread.is_alive()

    # ---- event-loop side ----------------------------------------------------------------------
    def _send(self, *command: Any) -> None:
        with self._wake:
            self._commands.append(command)
            self._wake.notify()

    def group(self) -> RequestGroup:
        """A new :class:`RequestGroup` bound to the running event loop."""
        group = RequestGroup(self, asyncio.get_running_loop())
        self._groups.add(group)
        return group

    def close_groups(self, reason: str) -> int:
        """End every open group with :class:`ServerStoppingError` (``reason``) and abort its requests;
        returns how many were open. Event loop only (the shutdown deadline calls it)."""
        open_groups = [g for g in list(self._groups) if g.unfinished]
        for g in open_groups:
            g.fail(ServerStoppingError(reason))
        return len(open_groups)

    async def generate(self, prompt_ids: list[int], params: SamplingParams,
                       request_id: str) -> AsyncIterator["RequestOutput"]:
        """One request: raises ``ValueError`` if rejected, then yields its outputs (abort on exit)."""
        group = self.group()
        await group.add(prompt_ids, params, request_id)
        async for out in group.outputs():
            yield out

    def abort(self, request_id: str) -> None:
        """Abort a request (no-op if it already finished). Thread-safe."""
        self._send("abort", (request_id,))

    async def call(self, fn: Callable[["Engine"], Any]) -> Any:
        """Run ``fn(engine)`` on the engine thread between steps and return its result."""
        return await asyncio.wrap_future(self.submit_call(fn))

    def call_sync(self, fn: Callable[["Engine"], Any], timeout: float = 30.0) -> Any:
        """Blocking :meth:`call` for other threads (tests, tools); never from the engine thread."""
        assert threading.current_thread() is not self._thread, "call_sync from the engine thread deadlocks"
        return self.submit_call(fn).result(timeout)

    def submit_call(self, fn: Callable[["Engine"], Any]) -> "concurrent.futures.Future[Any]":
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        if not self.healthy:
            fut.set_exception(EngineDeadError(self.dead_reason or "engine thread is not running"))
        else:
            self._send("call", fn, fut)
        return fut

    # ---- engine thread ------------------------------------------------------------------------
    def _run(self) -> None:
        checked_idle = True
        while True:
            with self._wake:
                while not self._commands and not self._stopping and not self._has_work():
                    self._wake.wait(timeout=1.0)
                if self._stopping:
                    break
                commands = list(self._commands)
                self._commands.clear()
            for cmd in commands:
                self._apply(cmd)
            if self._has_work():
                checked_idle = False
                self._step()
            elif not checked_idle and self._check_when_idle and self.dead_reason is None:
                checked_idle = True
                self._guarded(self.engine.check_integrity, "integrity check when idle")
        self._abort_all("server shutting down")

    def _has_work(self) -> bool:
        return self.dead_reason is None and self.engine.has_unfinished_requests()

    def _apply(self, cmd: tuple[Any, ...]) -> None:
        kind = cmd[0]
        if kind == "add":
            _, requests, group, accepted, session = cmd
            added: list[str] = []
            first_with: dict[tuple[int, ...], str] = {}  # prompt -> the first request added with it
            try:
                if self.dead_reason is not None:
                    raise EngineDeadError(self.dead_reason)
                for rid, ids, params in requests:
                    key = tuple(ids)
                    self.engine.add_request(ids, params, request_id=rid, session=session,
                                            place_with=first_with.get(key))
                    first_with.setdefault(key, rid)
                    added.append(rid)
            except Exception as exc:  # ValueError: bad request; anything else: reported as is
                for rid in added:  # all or none: the group is one request to its client
                    self._guarded(lambda: self.engine.abort_request(rid), f"abort of {rid}")
                _resolve(accepted, exc)
                return
            for rid in added:
                self._streams[rid] = group
            _resolve(accepted, None)
        elif kind == "abort":
            for rid in cmd[1]:
                if self._streams.pop(rid, None) is not None:
                    self._guarded(lambda: self.engine.abort_request(rid), f"abort of {rid}")
        elif kind == "call":
            _, fn, fut = cmd
            try:
                fut.set_result(fn(self.engine))
            except Exception as exc:
                fut.set_exception(exc)

    def _step(self) -> None:
        try:
            outputs = self.engine.step()
        except Exception:
            self._fail(f"engine step failed:\n{traceback.format_exc()}")
            return
        for out in outputs:
            stream = self._streams.get(out.request_id)
            if stream is None:
                continue  # aborted by its client meanwhile
            stream.put(out)
            if out.finished:
                del self._streams[out.request_id]

    def _guarded(self, fn: Callable[[], Any], what: str) -> None:
        try:
            fn()
        except Exception:
            self._fail(f"{what} failed:\n{traceback.format_exc()}")

    def _fail(self, reason: str) -> None:
        """The engine can no longer be trusted: fail everything in flight and report unhealthy."""
        log.error("atom engine failure: %s", reason)
        self.dead_reason = reason.splitlines()[0]
        self._abort_all(self.dead_reason)

    def _abort_all(self, reason: str) -> None:
        for rid, stream in list(self._streams.items()):
            stream.put(EngineDeadError(reason))
            try:
                self.engine.abort_request(rid)
            except Exception:
                log.exception("abort of %s during shutdown failed", rid)
        self._streams.clear()
        with self._wake:
            pending, self._commands = list(self._commands), collections.deque()
        for cmd in pending:
            if cmd[0] == "add":
                _resolve(cmd[3], EngineDeadError(reason))
            elif cmd[0] == "call":
                cmd[2].set_exception(EngineDeadError(reason))


def _resolve(fut: "asyncio.Future[Any]", exc: BaseException | None, result: Any = None) -> None:
    """Complete an event-loop future from the engine thread (ignored if its waiter is gone)."""

    def done() -> None:
        if fut.cancelled() or fut.done():
            return
        if exc is not None:
            fut.set_exception(exc)
        else:
            fut.set_result(result)

    try:
        fut.get_loop().call_soon_threadsafe(done)
    except RuntimeError:  # the loop is closed (server stopped)
        pass
