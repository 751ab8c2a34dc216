"""Fresh copies of an uninitialised module: what building it again would give, for a fraction of the cost.

A checkpoint of the release layout holds thousands of routed experts per model (35,000 tensors at 828 experts per
block), each an ``Expert`` of three Linears. Building one through its ``__init__`` costs about 70 us of
Python (``nn.Module.__setattr__`` checks every attribute it sets), so building the model on ``meta`` took longer
than reading a checkpoint of small tensors. Every parameter of these modules is ``torch.empty`` (never
initialised), so a copy whose tensors are new ``torch.empty`` tensors of the original's shapes, dtypes and devices
is the module a new ``__init__`` with the same arguments would build, on any device (contiguous, as these modules
make them; not ``empty_like``, whose stride logic on ``meta`` runs in Python). On ``meta``, where a tensor has no
data, the new tensors are clones of one prototype per parameter (new tensors, at half the cost of ``torch.empty``).

:func:`fresh_copy` makes such a copy by filling the instance's ``__dict__`` directly: tensors and submodules are
new, the ``nn.Module`` bookkeeping containers (parameter / buffer / module dicts, hook dicts, the non-persistent
buffer set) are new containers, and every other attribute is shared, so it must be immutable (numbers, strings,
``None``, ranges, functions). A module holding anything else (a list, a tensor outside its parameters and buffers)
is refused with a ``TypeError`` naming the attribute. :class:`ModuleTemplate` reads a module once and makes any
number of copies of it.
"""

from __future__ import annotations

from collections import OrderedDict
from types import BuiltinFunctionType, FunctionType, MethodType

import torch
from torch import nn

__all__ = ["fresh_copy", "ModuleTemplate"]

_CONTAINERS = {dict, OrderedDict, set}
#: Attribute types shared between copies (exact types: a subclass of one might be mutable).
_SHARED = {int, float, bool, str, bytes, type(None), range, tuple, frozenset, torch.dtype, torch.device,
           FunctionType, MethodType, BuiltinFunctionType, type}


def fresh_copy(module: nn.Module) -> nn.Module:
    """A new module equal to what ``type(module)(...)`` with the same arguments builds, parameters and buffers
    left uninitialised (``torch.empty``) on the original's device; its submodules are fresh copies too."""
    return ModuleTemplate(module).make()


class ModuleTemplate:
    """What :func:`fresh_copy` needs of ``module``, read once, so that :meth:`make` makes copy after copy
    (thousands of experts) without re-examining it. Raises ``TypeError`` as :func:`fresh_copy` does."""

    def __init__(self, module: nn.Module) -> None:
        self.cls = type(module)
        self.shared: dict[str, object] = {}
        self.containers: list[tuple[str, dict | set]] = []
        self.params: dict[str, tuple[tuple[int, ...], torch.dtype, torch.device, bool, torch.Tensor | None] | None] = {}
        self.buffers: dict[str, tuple[tuple[int, ...], torch.dtype, torch.device] | None] = {}
        self.children: dict[str, ModuleTemplate | None] = {}
        for name, value in module.__dict__.items():
            kind = type(value)
            if kind in _SHARED:
                self.shared[name] = value
            elif name == "_parameters":
                self.params = {k: None if p is None else (p.shape, p.dtype, p.device, p.requires_grad, _prototype(p))
                               for k, p in value.items()}
            elif name == "_buffers":
                self.buffers = {k: None if b is None else (b.shape, b.dtype, b.device) for k, b in value.items()}
            elif name == "_modules":
                self.children = {k: None if m is None else ModuleTemplate(m) for k, m in value.items()}
            elif kind in _CONTAINERS:
                items = value if kind is set else value.values()
                if value and any(isinstance(v, (torch.Tensor, nn.Module)) for v in items):
                    raise TypeError(f"{self.cls.__name__}.{name} holds tensors or modules; fresh_copy cannot copy it")
                self.containers.append((name, value))  # the hook dicts (empty on an unused module), name sets
            elif callable(value) and not isinstance(value, (torch.Tensor, nn.Module)):
                self.shared[name] = value  # a bound kernel: a function object
            else:
                raise TypeError(f"{self.cls.__name__}.{name} is a {kind.__name__}, which fresh_copy would share "
                                "between copies; only immutable attributes can be shared")

    def make(self) -> nn.Module:
        """A fresh copy: new tensors, new containers, new submodules; shared immutable attributes."""
        copy = object.__new__(self.cls)
        state = self.shared.copy()
        for name, value in self.containers:
            state[name] = value.copy()
        state["_parameters"] = {k: None if s is None else _parameter(s) for k, s in self.params.items()}
        state["_buffers"] = {k: None if s is None else torch.empty(s[0], dtype=s[1], device=s[2])
                             for k, s in self.buffers.items()}
        state["_modules"] = {k: None if t is None else t.make() for k, t in self.children.items()}
        copy.__dict__.update(state)
        return copy



def _prototype(p: torch.Tensor) -> torch.Tensor | None:
    """On the ``meta`` device, a tensor of ``p``'s shape and dtype whose clones are the copies' parameters (a
    clone of a meta tensor is a new tensor, as ``torch.empty`` makes, in half the time); None elsewhere, where a
    clone would copy bytes that ``torch.empty`` leaves untouched."""
    return torch.empty(p.shape, dtype=p.dtype, device=p.device) if p.device.type == "meta" else None


def _parameter(spec: tuple[tuple[int, ...], torch.dtype, torch.device, bool, torch.Tensor | None]) -> nn.Parameter:
    """A new uninitialised parameter of ``spec`` (shape, dtype, device, requires_grad, meta prototype); what
    ``nn.Parameter(tensor, requires_grad)`` does for a plain tensor, without its Python-level checks."""
    shape, dtype, device, requires_grad, prototype = spec
    data = prototype.clone() if prototype is not None else torch.empty(shape, dtype=dtype, device=device)
    return torch.Tensor._make_subclass(nn.Parameter, data, requires_grad)
