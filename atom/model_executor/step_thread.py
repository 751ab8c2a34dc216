"""Launched steps: the handle :meth:`ModelRunner.launch` returns, and the thread that runs them.

The overlapped engine loop (:meth:`LLMEngine.step`) launches step N, schedules step N+1, then asks
the handle for N's output. A :class:`StepThread` runs each launched step on one daemon thread, so
the caller's scheduling overlaps both the step's host work (building inputs, launching kernels or
replaying a graph) and its device time; the step's read-back (the sampled ids, copied to pinned
memory and waited on by an event on a GPU) blocks that thread, not the scheduler. Steps run one at a
time, in launch order, and the engine asks for N's output before it launches N+1, so the runner's
state is only ever touched by one step at a time. :class:`~atom.step_contract.ReadyOutput` is the handle
of a step that already ran (a runner without a step thread).
"""

from __future__ import annotations

import concurrent.futures
import queue
import threading
import weakref
from typing import Any, Callable

__all__ = ["StepThread"]


class StepThread:
    """One daemon thread running submitted calls in order; each :meth:`submit` returns a future
    whose ``result()`` is the call's return value (or raises its exception). The thread holds no
    reference to its owner: it ends when this object is collected (or :meth:`close`)."""

    def __init__(self, name: str = "atom-step") -> None:
        self._queue: queue.SimpleQueue[tuple[Callable[..., Any], tuple[Any, ...], concurrent.futures.Future] | None]
        self._queue = queue.SimpleQueue()
        self._thread = threading.Thread(target=_serve, args=(self._queue,), name=name, daemon=True)
        self._thread.start()
        self._closer = weakref.finalize(self, self._queue.put, None)

    def submit(self, fn: Callable[..., Any], *args: Any) -> concurrent.futures.Future:
        if not self._closer.alive:
            raise RuntimeError("submit to a closed StepThread")
        fut: concurrent.futures.Future = concurrent.futures.Future()
        self._queue.put((fn, args, fut))
        return fut

    def close(self) -> None:
        """Let the thread end after the calls already submitted."""
        self._closer()


def _serve(work: "queue.SimpleQueue[Any]") -> None:
    while True:
        item = work.get()
        if item is None:
            return
        fn, args, fut = item
        del item
        if not fut.set_running_or_notify_cancel():
            continue
        try:
            fut.set_result(fn(*args))
        except BaseException as exc:  # handed to the caller of result()
            fut.set_exception(exc)
        del fn, args, fut  # drop the step (and its runner) before waiting for the next
