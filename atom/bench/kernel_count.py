"""Counting the device kernels a piece of code launches on the Triton backend, under the interpreter.

:class:`KernelCounter` counts two kinds of launch while active:

* every Triton kernel launch (a ``GridExecutor`` call of ``triton.runtime.interpreter``: one grid is one
  launch on a GPU), and
* every aten op dispatched outside a Triton launch that does device work. Ops that make views
  (``OpOverload.is_view``) and the allocation / metadata ops in :data:`NO_LAUNCH` launch nothing. The aten
  ops the interpreter itself runs to move a launch's arguments are inside the launch and not counted.

It needs ``TRITON_INTERPRET=1`` set before triton is imported (the interpreter is where launches are seen
on a CPU).

``KernelCounter(run_triton=False)`` counts each Triton launch without running its programs (the interpreter
runs a grid's programs one after another, so a batch-32 step takes tens of minutes on a CPU). The count is the
same when the code counted reads no device value back (the engine's forward: ``tests/engine/
test_forward_is_host_free.py``): which ops run then depends on shapes only, never on what a kernel wrote. The
kernels' outputs are left as allocated (unspecified values) for the aten ops that follow, so use it only
to count.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["KernelCounter", "NO_LAUNCH"]

#: aten ops that allocate or only touch metadata: no kernel on a GPU.
NO_LAUNCH = frozenset({"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "detach",
                       "lift_fresh", "alias", "set_", "resize_", "sym_size", "sym_stride", "sym_numel",
                       "is_same_size", "_has_compatible_shallow_copy_type", "size", "stride", "dim", "numel"})


class KernelCounter(TorchDispatchMode):
    """``with KernelCounter() as c: ...`` then ``c.total`` (Triton launches plus launching aten ops),
    ``c.triton`` and ``c.aten`` (a ``Counter`` by op name). ``run_triton=False``: count Triton launches without
    running them (module docstring)."""

    def __init__(self, run_triton: bool = True) -> None:
        super().__init__()
        self.run_triton = run_triton
        self.triton = 0
        self.aten: Counter[str] = Counter()
        self._inside = 0
        self._original = None

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        name = func.overloadpacket.__name__
        if not self._inside and not func.is_view and name not in NO_LAUNCH:
            self.aten[name] += 1
        return func(*args, **(kwargs or {}))

    def __enter__(self) -> "KernelCounter":
        from triton.runtime import interpreter

        original = interpreter.GridExecutor.__call__
        counter = self

        def counted(executor: Any, *args: Any, **kwargs: Any) -> Any:
            counter.triton += 1
            if not counter.run_triton:
                return None
            counter._inside += 1
            try:
                return original(executor, *args, **kwargs)
            finally:
                counter._inside -= 1

        self._original = original
        interpreter.GridExecutor.__call__ = counted
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        from triton.runtime import interpreter

        interpreter.GridExecutor.__call__ = self._original
        super().__exit__(*exc)

    @property
    def total(self) -> int:
        return self.triton + sum(self.aten.values())
