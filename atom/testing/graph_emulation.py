"""CUDA-graph capture and replay emulated on the CPU, so the decode-graph code path runs without a GPU.

A CUDA graph records the kernels one run of a function launches, each with the addresses it read and
wrote; a replay launches the same kernels on the same addresses. Whatever the function computed on the
host during capture (Python control flow, shapes, constants built from lists) is frozen, tensors that
existed before capture are read with the contents they hold at replay, and tensors allocated during
capture are rewritten in place. A host read of a device value (``.item()``, ``.tolist()``, ``nonzero``,
boolean selection) is an error during capture.

:func:`cuda_graph_emulation` installs stand-ins for the parts of ``torch.cuda`` that graph code uses
(``is_available``, ``Stream``, ``stream``, ``current_stream``, ``CUDAGraph``, ``graph``,
``graph_pool_handle``). The stand-in graph records every aten op dispatched during capture (through a
``TorchDispatchMode``) with the very tensor objects it took and returned; replay runs the recorded ops
again on those objects in order and copies each freshly allocated result into the tensor the capture
returned, which is what a replay does to the graph's memory pool. So a tensor cached from a run before
capture keeps its old contents, exactly as on a GPU, while everything computed inside the capture
follows the new inputs. Collectives (``torch.distributed`` on gloo dispatches them as ``c10d`` ops) are
recorded like any op and replayed in place, each waited on before the next op (on a GPU, NCCL collectives
captured in a graph run in stream order), so every rank of a group replays its own graph in step with the
others'.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

__all__ = ["EmulatedGraph", "GraphCaptureError", "cuda_graph_emulation"]

_aten = torch.ops.aten
# ops that read a device value back or whose output shape depends on values: not capturable
_HOST_READS = {_aten._local_scalar_dense.default, _aten.equal.default, _aten.nonzero.default,
               _aten.masked_select.default, _aten._unique2.default, _aten.unique_consecutive.default,
               _aten.unique_dim.default, _aten.repeat_interleave.Tensor}


class GraphCaptureError(RuntimeError):
    """An op that a CUDA graph cannot record ran during capture."""


def _storages(values: list[Any]) -> set[int]:
    return {v.untyped_storage().data_ptr() for v in values if isinstance(v, torch.Tensor)}


class _Recorder(TorchDispatchMode):
    """Runs every op and appends ``(op, args, kwargs, outputs, fresh)`` to ``ops``; ``fresh[i]``: output ``i``
    is a new allocation (not a view of, or an in-place write into, one of the op's inputs)."""

    def __init__(self, ops: list) -> None:
        super().__init__()
        self.ops = ops

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _HOST_READS:
            raise GraphCaptureError(f"{func} reads a device value back (or has a value-dependent shape): "
                                    "a CUDA graph cannot record it")
        out = func(*args, **kwargs)
        inputs = _storages(tree_flatten((args, kwargs))[0])
        flat = tree_flatten(out)[0]
        fresh = [isinstance(o, torch.Tensor) and o.untyped_storage().data_ptr() not in inputs for o in flat]
        self.ops.append((func, args, kwargs, flat, fresh))
        return out


class EmulatedGraph:
    """A stand-in for ``torch.cuda.CUDAGraph``: :meth:`capture_begin` / :meth:`capture_end` around one
    run, then :meth:`replay` as often as wanted."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.ops: list = []
        self._mode: _Recorder | None = None
        self.captured = False

    def capture_begin(self, *args: Any, **kwargs: Any) -> None:
        if self.captured or self._mode is not None:
            raise GraphCaptureError("this graph is already captured")
        self._mode = _Recorder(self.ops)
        self._mode.__enter__()

    def capture_end(self) -> None:
        mode, self._mode = self._mode, None
        mode.__exit__(None, None, None)
        self.captured = True

    @torch.no_grad()
    def replay(self) -> None:
        if not self.captured:
            raise GraphCaptureError("replay() before capture")
        for func, args, kwargs, outs, fresh in self.ops:
            again = tree_flatten(func(*args, **kwargs))[0]
            for old, new, is_fresh in zip(outs, again, fresh):
                if is_fresh and old.numel():
                    old.copy_(new)
                elif not isinstance(new, torch.Tensor) and hasattr(new, "wait"):
                    new.wait()  # a collective's work handle: done before the next op, as in stream order

    def reset(self) -> None:
        self.ops.clear()
        self.captured = False

    def pool(self) -> tuple[int, int]:
        return (0, id(self))


class _NullStream:
    """A stream on which everything is already ordered (the CPU runs ops in program order)."""

    def wait_stream(self, other: Any) -> None:
        pass

    def synchronize(self) -> None:
        pass


@contextlib.contextmanager
def _graph_context(graph: EmulatedGraph, pool: Any = None, stream: Any = None, **kwargs: Any) -> Iterator[None]:
    graph.capture_begin()
    try:
        yield
    finally:
        graph.capture_end()


@contextlib.contextmanager
def cuda_graph_emulation() -> Iterator[None]:
    """Within the block, ``torch.cuda`` reports a device and its graph API captures and replays on the CPU
    (:class:`EmulatedGraph`). Tensors stay where they are: run the model on the CPU."""
    cuda = torch.cuda
    names = ("is_available", "Stream", "stream", "current_stream", "CUDAGraph", "graph", "graph_pool_handle")
    saved = {name: getattr(cuda, name) for name in names}
    stand_ins = dict(is_available=lambda: True, Stream=lambda *a, **k: _NullStream(),
                     stream=lambda s: contextlib.nullcontext(), current_stream=lambda *a, **k: _NullStream(),
                     CUDAGraph=EmulatedGraph, graph=_graph_context, graph_pool_handle=lambda: (0, 0))
    try:
        for name, value in stand_ins.items():
            setattr(cuda, name, value)
        yield
    finally:
        for name, value in saved.items():
            setattr(cuda, name, value)
