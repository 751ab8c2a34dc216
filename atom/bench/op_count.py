"""Counting what a piece of torch code dispatches: aten ops by name and host syncs.

:class:`OpCounter` is a ``TorchDispatchMode`` that tallies every aten op the code under it runs.
Host syncs are the ops that copy a device value to the host: ``aten._local_scalar_dense`` (behind
``.item()``, ``int(t)``, ``bool(t)``), ``aten.nonzero`` (its output size depends on values) and
``Tensor.tolist`` (which does not dispatch an aten op, so the counter wraps it while active), and
indexing with a boolean mask (``aten.index`` / ``index_put`` given a bool index: its size depends
on values; counted as ``index_bool``). A registered fused op (``torch.ops.atom.*``) counts once,
like the one kernel launch it is on a GPU.
Used by the forward benchmark and by the test that keeps the decode step sync-free.
"""

from __future__ import annotations

from collections import Counter
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
        self._tolist = None

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        name = func.overloadpacket.__name__
        self.ops[name] += 1
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
