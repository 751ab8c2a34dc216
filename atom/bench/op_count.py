"""Counting what a piece of torch code dispatches: aten ops by name and host syncs.

:class:`OpCounter` is a ``TorchDispatchMode`` that tallies every aten op the code under it runs.
Host syncs are the ops that copy a device value to the host: ``aten._local_scalar_dense`` (behind
``.item()``, ``int(t)``, ``bool(t)``), ``aten.nonzero`` (its output size depends on values) and
``Tensor.tolist`` (which does not dispatch an aten op, so the counter wraps it while active), and
indexing with a boolean mask (``aten.index`` / ``index_put`` given a bool index: its size depends
on values; counted as ``index_bool``). A registered fused op (``torch.ops.atom.*``) counts once,
like the one kernel launch it is on a GPU.

``launches`` estimates the kernel launches the same code makes on a GPU backend: ops that only make
a view (``OpOverload.is_view``: slices, reshapes, transposes) launch nothing, and one call of a kernel
op of :mod:`atom.kernels` (a function listed in ``atom.kernels.backend.OPS``) counts once however many
aten ops its torch reference dispatches, as its Triton body is one launch. The aten op count stays the
primary figure (it is what the CPU executes); ``launches`` says how much of it is reference code.
Used by the forward benchmark and by the test that keeps the decode step sync-free.
"""

from __future__ import annotations

import functools
import importlib
import sys
from collections import Counter
from types import CodeType, FrameType
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["OpCounter", "SYNC_OPS"]

SYNC_OPS = ("_local_scalar_dense", "nonzero", "tolist", "index_bool")


class OpCounter(TorchDispatchMode):
    """``with OpCounter() as c: ...`` then ``c.total`` (aten ops), ``c.syncs`` and ``c.ops`` (by name)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()
        self.launches = 0
        self._tolist = None
        self._kernel_call: FrameType | None = None  # held, so a later call cannot reuse its identity

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        name = func.overloadpacket.__name__
        self.ops[name] += 1
        call = _kernel_call(sys._getframe(1))
        if call is not None:
            self.launches += call is not self._kernel_call
            self._kernel_call = call
        else:
            self.launches += not func.is_view
        if name in ("index", "index_put", "index_put_") and len(args) > 1 and any(
                isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1]):
            self.ops["index_bool"] += 1
        return func(*args, **(kwargs or {}))

    def __enter__(self) -> "OpCounter":
        original = torch.Tensor.tolist
        self._tolist = original
        counter = self

        def counted_tolist(t: torch.Tensor) -> Any:
            counter.ops["tolist"] += 1
            return original(t)

        torch.Tensor.tolist = counted_tolist
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        torch.Tensor.tolist = self._tolist
        super().__exit__(*exc)

    @property
    def total(self) -> int:
        """Every counted op, ``tolist`` calls included."""
        return sum(self.ops.values())

    @property
    def syncs(self) -> int:
        return sum(self.ops[name] for name in SYNC_OPS)


@functools.cache
def _kernel_codes() -> frozenset[CodeType]:
    """The code objects of every kernel op's Triton wrapper and torch reference."""
    from atom.kernels.backend import OPS

    codes = set()
    for module_name, *names in OPS.values():
        module = importlib.import_module(f"atom.kernels.{module_name}")
        codes.update(getattr(module, n).__code__ for n in names)
    return frozenset(codes)


def _kernel_call(frame: FrameType | None) -> FrameType | None:
    """The outermost frame of a kernel op call on the stack from ``frame``, or None."""
    codes, found = _kernel_codes(), None
    while frame is not None:
        if frame.f_code in codes:
            found = frame
        frame = frame.f_back
    return found
