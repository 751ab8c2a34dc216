"""Index arithmetic of the torch references computed once per engine step instead of once per layer.

A torch reference turns its index arguments (page tables, per-token sequence and position, ``cu_seqlens``,
entry lists) into row numbers and keep masks before it moves any data. In one step every layer passes the
same index tensors (the step's, and the ones :meth:`StepInputs.derive` builds once), so that arithmetic, a
handful to a few dozen small torch ops per call, gives the same tensors in all 43 layers of a V4 step; on
the CPU, where each op costs microseconds of dispatch, it was a sizeable part of a decode step.

:func:`step_memo` opens a scope (the serving model's forward); inside it a function decorated with
:func:`memoized` runs once per distinct argument list and returns the same result objects afterwards.
Tensor arguments are told apart by identity and version counter (an in-place write makes a new key), the
others by value (they must be hashable). The scope holds the arguments, so their identities stay unique,
and drops everything when it ends. Outside a scope a memoized function simply runs. Results are shared:
callers must not write into them. Only index arithmetic is memoized, never a read of data tensors, and a
memoized function returns exactly what it would compute, so values are bit for bit unchanged. The Triton
wrappers do this arithmetic in registers and do not use it.
"""

from __future__ import annotations

import functools
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Callable, Iterator, TypeVar

import torch

__all__ = ["memoized", "step_memo"]

_MEMO: ContextVar[dict | None] = ContextVar("atom_kernel_step_memo", default=None)

F = TypeVar("F", bound=Callable[..., Any])


@contextmanager
def step_memo() -> Iterator[None]:
    """Inside the block, :func:`memoized` functions compute each distinct argument list once. Index tensors
    passed to them must not change inside the block except through torch ops (which bump their version)."""
    token = _MEMO.set({})
    try:
        yield
    finally:
        _MEMO.reset(token)


def memoized(fn: F) -> F:
    """``fn`` computed once per distinct positional arguments inside :func:`step_memo` (see the module
    docstring); inference-mode tensors (no version counter) bypass the memo."""

    @functools.wraps(fn)
    def wrapper(*args: Any) -> Any:
        memo = _MEMO.get()
        if memo is None:
            return fn(*args)
        key = [fn]
        for a in args:  # one loop, no call per argument: the wrapper runs for every reference call of a step
            if isinstance(a, torch.Tensor):
                if a.is_inference():
                    return fn(*args)
                key.append((id(a), a._version))  # a pair: never equal to a plain argument
            else:
                key.append(a)
        key = tuple(key)
        hit = memo.get(key)
        if hit is None:
            hit = memo[key] = (args, fn(*args))  # the arguments are held: their ids stay unique in the scope
        return hit[1]

    return wrapper  # type: ignore[return-value]
