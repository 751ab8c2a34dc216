"""What a piece of torch code would ask of a GPU, seen on a CPU-only machine through fake tensors.

:func:`fake_cuda` runs code under ``torch._subclasses.fake_tensor.FakeTensorMode`` with tensors placed on
a ``cuda`` device: every op computes shapes, dtypes and devices only, so a model of any structure runs
without a GPU and without memory for its values. Under it a :class:`DeviceAccessCounter` lists, each
with the stack of the code that caused it:

* ``h2d``: blocking host-to-device copies (``aten._to_copy`` / ``aten.copy_`` from a CPU tensor into a
  ``cuda`` one without ``non_blocking``, which is also what ``torch.tensor(..., device="cuda")``
  dispatches). Each is a stream sync on a GPU and is forbidden inside CUDA-graph capture;
* ``staged_h2d``: non-blocking host-to-device copies (from pinned memory on a GPU: asynchronous),
  counted apart;
* ``syncs``: device-to-host reads: ``.item()`` / ``bool(t)`` / ``int(t)`` (``aten._local_scalar_dense``),
  ``Tensor.tolist`` and ``torch.equal`` on a ``cuda`` tensor, and blocking copies to the host;
* ``token_reads``: non-blocking copies to the host (the allowed read of the sampled token ids, into
  pinned memory, waited on by an event), counted apart;
* ``data_dependent``: ops whose output shape depends on tensor values (``nonzero``, boolean-mask
  indexing, ``masked_select``, ``unique``, ``repeat_interleave`` without ``output_size``).

Fake tensors hold no values, so a read cannot be answered: the counter records it and the read returns
zeros, or True for a boolean (so a value check passes; a ``nonzero`` or boolean mask as if every element
were set) so the code runs on; after such a read the
path taken may differ from a real device's. Triton launches (``JITFunction.run``) are skipped: the
kernel wrappers still run their checks, shape logic and output allocation. A ``torch.Generator`` asked for
on ``cuda`` is a CPU one and ``torch.cuda.Event`` a no-op (both need the driver); pinned allocations are
plain host ones. Tensor methods whose Python bindings take a CUDA device guard (indexing, ``copy_``,
``~``, ``contiguous``, ``item`` / ``int`` / ``bool``) run through their aten ops. Other ``torch.cuda`` calls that need a driver (streams, graphs) are
not emulated.
"""

from __future__ import annotations

import contextlib
import traceback
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["KINDS", "DeviceAccessCounter", "Access", "fake_cuda", "to_fake_cuda"]

KINDS = ("h2d", "syncs", "data_dependent", "staged_h2d", "token_reads")

_SHAPE_FROM_VALUES = ("nonzero", "masked_select", "_unique2", "unique_dim", "unique_consecutive", "argwhere")
_PROJECT_MARKERS = ("/atom/", "/kernels/")


@dataclass(frozen=True)
class Access:
    """One counted event: its ``kind`` (one of :data:`KINDS`), the aten op, and ``where``: the innermost
    frame of the project's code that caused it (``path:line function``)."""

    kind: str
    op: str
    where: str


@dataclass
class DeviceAccessCounter(TorchDispatchMode):
    """Counts host-device traffic and value-dependent ops of the code run under it (module docstring).

    ``accesses`` lists every event in order; :meth:`counts` sums them by kind; :meth:`sites` groups one
    kind by the code location that caused it."""

    accesses: list[Access] = field(default_factory=list)

    def __post_init__(self) -> None:
        super().__init__()

    def counts(self) -> dict[str, int]:
        tally = Counter(a.kind for a in self.accesses)
        return {kind: tally[kind] for kind in KINDS}

    def sites(self, kind: str) -> Counter[str]:
        return Counter(f"{a.where} ({a.op})" for a in self.accesses if a.kind == kind)

    def _record(self, kind: str, op: str) -> None:
        self.accesses.append(Access(kind, op, _project_frame()))

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        if name == "_to_copy" and "device" in kwargs:
            self._transfer(name, _device_of(args[0]), torch.device(kwargs["device"]), kwargs.get("non_blocking", False))
        elif name == "copy_":
            self._transfer(name, _device_of(args[1]), _device_of(args[0]),
                           args[2] if len(args) > 2 else kwargs.get("non_blocking", False))
        elif name in ("_local_scalar_dense", "equal", "is_nonzero"):
            if any(_on_cuda(a) for a in args):
                self._record("syncs", name)
        elif name in _SHAPE_FROM_VALUES or (name == "repeat_interleave" and isinstance(args[0], torch.Tensor)
                                            and kwargs.get("output_size") is None):
            self._record("data_dependent", name)
        elif name in _INDEX_OPS and _bool_index(args):
            self._record("data_dependent", f"{name}[bool]")
        return func(*args, **kwargs)

    def _transfer(self, op: str, src: torch.device | None, dst: torch.device | None, non_blocking: bool) -> None:
        if src is None or dst is None:
            return
        if src.type == "cpu" and dst.type == "cuda":
            self._record("staged_h2d" if non_blocking else "h2d", op)
        elif src.type == "cuda" and dst.type == "cpu":
            self._record("token_reads" if non_blocking else "syncs", op)

    def __enter__(self) -> "DeviceAccessCounter":
        _COUNTERS.append(self)
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        _COUNTERS.remove(self)
        super().__exit__(*exc)


_COUNTERS: list[DeviceAccessCounter] = []  # the active ones, told of ``Tensor.tolist`` (which does not dispatch)
_INDEX_OPS = ("index", "index_put", "index_put_", "_index_put_impl_")


@contextlib.contextmanager
def fake_cuda() -> Iterator[FakeTensorMode]:
    """Fake tensors (real CPU tensors created before are accepted and converted), Triton launches skipped."""
    from triton.runtime.jit import JITFunction

    launch = JITFunction.run

    def skipped(self: Any, *args: Any, grid: Any, warmup: Any, **kwargs: Any) -> None:
        if not any(isinstance(a, FakeTensor) for a in list(args) + list(kwargs.values())):
            return launch(self, *args, grid=grid, warmup=warmup, **kwargs)
        return None

    generator = torch.Generator

    class HostGenerator(generator):  # a type, so annotations such as ``torch.Generator | None`` still work
        def __new__(cls, device: Any = "cpu") -> torch.Generator:
            return generator("cpu" if torch.device(device).type == "cuda" else device)

    event, nonzero = torch.cuda.Event, torch.nonzero

    def nonzero_of_fake(x: torch.Tensor, *, as_tuple: bool = False, **kwargs: Any) -> Any:
        if not isinstance(x, FakeTensor) or kwargs:  # torch.nonzero's binding takes a device guard
            return nonzero(x, as_tuple=as_tuple, **kwargs)
        out = torch.ops.aten.nonzero(x)
        return out.unbind(1) if as_tuple else out

    JITFunction.run, torch.Generator, torch.cuda.Event = skipped, HostGenerator, _HostEvent
    torch.nonzero = nonzero_of_fake
    for name, method in _GUARDED_METHODS.items():
        setattr(FakeTensor, name, method)
    try:
        with FakeTensorMode(allow_non_fake_inputs=True) as mode, _HostStandIns():
            yield mode
    finally:
        JITFunction.run, torch.Generator, torch.cuda.Event = launch, generator, event
        torch.nonzero = nonzero
        for name in _GUARDED_METHODS:
            delattr(FakeTensor, name)


def _copy(t: torch.Tensor, src: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
    """``Tensor.copy_`` through the aten op (its Python binding takes a device guard too)."""
    return torch.ops.aten.copy_(t, src, non_blocking)


class _HostEvent:
    """``torch.cuda.Event`` under fake tensors: nothing to wait for (the copy it guards is counted where it is
    made)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def record(self, stream: Any = None) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def wait(self, stream: Any = None) -> None:
        pass

    def query(self) -> bool:
        return True


class _HostStandIns(TorchDispatchMode):
    """Below the counters: what fake tensors cannot do, stood in for. Pinned host memory is plain host
    memory (``pin_memory()`` returns the tensor, ``pin_memory=True`` allocations are plain); a value read
    returns zeros; a value-dependent op answers as if every element were set."""

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = dict(kwargs or {})
        name = func.overloadpacket.__name__
        if name == "_pin_memory":
            return args[0]
        if name == "is_pinned":
            return True
        if kwargs.get("pin_memory"):
            kwargs["pin_memory"] = False
        if name in ("_local_scalar_dense", "is_nonzero"):
            return _zero_scalar(args[0])
        if name == "equal":
            return True
        if name in _SHAPE_FROM_VALUES or (name == "repeat_interleave" and isinstance(args[0], torch.Tensor)
                                          and kwargs.get("output_size") is None):
            return _as_if_all_set(func, name, args, kwargs)
        if name in _INDEX_OPS and _bool_index(args):
            return func(args[0], _bool_as_positions(args[1]), *args[2:], **kwargs)
        return func(*args, **kwargs)


def _tolist(t: torch.Tensor) -> Any:
    """``Tensor.tolist`` of a fake tensor: zeros of its shape, a sync for the active counters when on ``cuda``."""
    if t.device.type == "cuda":
        for counter in _COUNTERS:
            counter._record("syncs", "tolist")
    return _zeros_list(t)


def _invert(t: torch.Tensor) -> torch.Tensor:
    return torch.ops.aten.bitwise_not(t)


def _contiguous(t: torch.Tensor, memory_format: torch.memory_format = torch.contiguous_format) -> torch.Tensor:
    return t if t.is_contiguous(memory_format=memory_format) else torch.ops.aten.clone(t, memory_format=memory_format)


def _scalar(t: torch.Tensor) -> Any:
    return torch.ops.aten._local_scalar_dense(t)


def _consumed(i: Any) -> int:
    """How many dims of the indexed tensor one index item consumes."""
    if i is None or i is Ellipsis:
        return 0
    if isinstance(i, torch.Tensor) and i.dtype == torch.bool:
        return i.dim()
    return 1


def _basic(t: torch.Tensor, index: Any) -> tuple[torch.Tensor, list]:
    """Python indexing of a fake tensor through aten ops (torch's C++ indexing takes a CUDA device guard,
    which a CPU-only build lacks): ``(the view after ints, slices, None and Ellipsis, the advanced
    indices per dim of that view: None where a dim is not indexed)``."""
    items = list(index) if isinstance(index, tuple) else [index]
    out, dim, advanced = t, 0, []
    for k, i in enumerate(items):
        if i is None:
            out = out.unsqueeze(dim)
            dim += 1
        elif i is Ellipsis:
            dim += out.dim() - dim - sum(_consumed(j) for j in items[k + 1:])
        elif isinstance(i, bool) or isinstance(i, (list, torch.Tensor)):
            tensor = i if isinstance(i, torch.Tensor) else torch.tensor(i, device=out.device)
            advanced.extend([None] * (dim - len(advanced)) + [tensor])
            dim += _consumed(tensor)
            advanced.extend([None] * (tensor.dim() - 1) if tensor.dtype == torch.bool else [])
        elif isinstance(i, slice):
            out = torch.ops.aten.slice(out, dim, i.start, i.stop, 1 if i.step is None else i.step)
            dim += 1
        else:
            out = torch.ops.aten.select(out, dim, int(i))
    bool_dims = [a for a in advanced if isinstance(a, torch.Tensor) and a.dtype == torch.bool]
    if bool_dims:  # aten.index takes a mask as one entry covering its dims
        packed, skip = [], 0
        for a in advanced:
            if skip:
                skip -= 1
                continue
            packed.append(a)
            skip = a.dim() - 1 if isinstance(a, torch.Tensor) and a.dtype == torch.bool else 0
        advanced = packed
    return out, advanced


def _getitem(t: torch.Tensor, index: Any) -> torch.Tensor:
    out, advanced = _basic(t, index)
    return torch.ops.aten.index(out, advanced) if advanced else out


def _setitem(t: torch.Tensor, index: Any, value: Any) -> None:
    out, advanced = _basic(t, index)
    if not advanced:
        if isinstance(value, torch.Tensor):
            torch.ops.aten.copy_(out, value)
        else:
            out.fill_(value)
        return
    if not isinstance(value, torch.Tensor):
        value = torch.full((), value, dtype=out.dtype, device=out.device)
    torch.ops.aten.index_put_(out, advanced, value)


def to_fake_cuda(module: torch.nn.Module, mode: FakeTensorMode) -> torch.nn.Module:
    """``module`` with every parameter and buffer replaced by a fake tensor of the same shape and dtype on
    ``cuda`` (changed in place and returned; values are not kept, so a ``meta`` module works). Plain tensor
    attributes stay where they are: a CPU constant the forward moves to the device shows as a copy."""
    with mode:
        for sub in module.modules():
            for name, p in list(sub.named_parameters(recurse=False)):
                fake = torch.empty(p.shape, dtype=p.dtype, device="cuda")
                sub._parameters[name] = torch.nn.Parameter(fake, requires_grad=False)
            for name, b in list(sub.named_buffers(recurse=False)):
                if b is not None:
                    sub._buffers[name] = torch.empty(b.shape, dtype=b.dtype, device="cuda")
    return module


# Tensor methods whose Python bindings take a CUDA device guard (absent from a CPU-only build), routed through
# their aten ops for fake tensors
_GUARDED_METHODS = {"__getitem__": _getitem, "__setitem__": _setitem, "copy_": _copy, "__invert__": _invert,
                    "contiguous": _contiguous, "tolist": _tolist, "item": _scalar,
                    "__int__": lambda t: int(_scalar(t)), "__float__": lambda t: float(_scalar(t)),
                    "__bool__": lambda t: bool(_scalar(t)), "__index__": lambda t: int(_scalar(t))}


def _device_of(t: Any) -> torch.device | None:
    return t.device if isinstance(t, torch.Tensor) else None


def _on_cuda(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type == "cuda"


def _zero_scalar(t: torch.Tensor) -> bool | int | float:
    if t.dtype == torch.bool:
        return True  # a read check (``if not ok.all(): raise``) passes
    return 0.0 if t.dtype.is_floating_point else 0


def _zeros_list(t: torch.Tensor) -> Any:
    value = _zero_scalar(t)
    if t.dim() == 0:
        return value
    out: Any = [value] * t.shape[-1]
    for size in reversed(t.shape[:-1]):
        out = [list(out) for _ in range(size)]
    return out


def _bool_index(args: tuple) -> bool:
    return len(args) > 1 and isinstance(args[1], (list, tuple)) and any(
        isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1])


def _bool_as_positions(indices: list) -> list:
    """Boolean masks replaced by the positions of every element (a mask with all elements set)."""
    out: list = []
    for i in indices:
        if isinstance(i, torch.Tensor) and i.dtype == torch.bool:
            grids = torch.meshgrid(*[torch.arange(n, device=i.device) for n in i.shape], indexing="ij")
            out.extend(g.flatten() for g in grids)
        else:
            out.append(i)
    return out


def _as_if_all_set(func: Any, name: str, args: tuple, kwargs: dict) -> torch.Tensor:
    x = args[0]
    if name in ("nonzero", "argwhere"):
        return torch.empty((x.numel(), x.dim()), dtype=torch.long, device=x.device)
    if name == "masked_select":
        return torch.empty((torch.broadcast_shapes(x.shape, args[1].shape).numel(),), dtype=x.dtype,
                           device=x.device)
    if name == "repeat_interleave":
        size = x.numel() if len(args) == 1 else args[0].numel()
        return torch.empty((size,), dtype=torch.long, device=x.device)
    # unique: as many distinct values as elements
    values = torch.empty((x.numel(),), dtype=x.dtype, device=x.device)
    extra = torch.empty((x.numel(),), dtype=torch.long, device=x.device)
    return (values, extra, extra) if name != "unique_consecutive" else (values, extra, extra)


def _project_frame() -> str:
    """``path:line function`` of the innermost frame in the project's code (``atom/`` or ``kernels/``)."""
    for frame in reversed(traceback.extract_stack()[:-3]):
        if any(m in frame.filename for m in _PROJECT_MARKERS) and "/bench/fake_device.py" not in frame.filename:
            path = frame.filename
            for m in _PROJECT_MARKERS:
                if m in path:
                    path = m.strip("/") + "/" + path.split(m, 1)[1]
                    break
            return f"{path}:{frame.lineno} {frame.name}"
    return "<outside the project>"
