"""Fresh copies of an uninitialised module: what building it again would give, for a fraction of the cost.

A checkpoint of the release layout holds thousands of routed experts per model (35,000 tensors at 828 experts
per block), each an ``Expert`` of three ``Linear`` s. Building one through its ``__init__`` costs about 100 us
of Python (``nn.Module.__setattr__`` checks every attribute it sets), so building the model on ``meta`` took
longer than reading a checkpoint of small tensors. Every parameter of these modules is ``torch.empty``
(never initialised), so a copy whose tensors are ``torch.empty_like`` the original's is the module a
new ``__init__`` with the same arguments would build, on any device.

:func:`fresh_copy` makes such a copy by filling the instance's ``__dict__`` directly: tensors and submodules
are new, the ``nn.Module`` bookkeeping containers (parameter / buffer / module dicts, hook dicts, the
non-persistent buffer set) are new containers, and every other attribute is shared, so it must be immutable
(numbers, strings, ``None``, ranges, functions). A module holding anything else (a list, a tensor outside its
parameters and buffers) is refused with a ``TypeError`` naming the attribute.
"""

from __future__ import annotations

from collections import OrderedDict
from types import BuiltinFunctionType, FunctionType, MethodType

import torch
from torch import nn

__all__ = ["fresh_copy"]

_CONTAINERS = {dict, OrderedDict, set}
#: Attribute types shared between copies (exact types: a subclass of one might be mutable).
_SHARED = {int, float, bool, str, bytes, type(None), range, tuple, frozenset, torch.dtype, torch.device,
           FunctionType, MethodType, BuiltinFunctionType, type}


def fresh_copy(module: nn.Module) -> nn.Module:
    """A new module equal to what ``type(module)(...)`` with the same arguments builds, parameters and buffers
    left uninitialised (``torch.empty``) on the original's device; its submodules are fresh copies too."""
    copy = object.__new__(type(module))
    state = {}
    for name, value in module.__dict__.items():
        kind = type(value)
        if kind in _SHARED:
            state[name] = value
        elif name == "_parameters":
            state[name] = {k: None if p is None else nn.Parameter(_empty(p), requires_grad=p.requires_grad)
                           for k, p in value.items()}
        elif name == "_buffers":
            state[name] = {k: None if b is None else _empty(b) for k, b in value.items()}
        elif name == "_modules":
            state[name] = {k: None if m is None else fresh_copy(m) for k, m in value.items()}
        elif kind in _CONTAINERS:
            items = value if kind is set else value.values()
            if value and any(isinstance(v, (torch.Tensor, nn.Module)) for v in items):
                raise TypeError(f"{type(module).__name__}.{name} holds tensors or modules; fresh_copy cannot copy it")
            state[name] = value.copy()  # the hook dicts (empty on an unused module) and buffer name sets
        elif callable(value) and not isinstance(value, (torch.Tensor, nn.Module)):
            state[name] = value  # a bound kernel: a function object
        else:
            raise TypeError(f"{type(module).__name__}.{name} is a {kind.__name__}, which fresh_copy would share "
                            "between copies; only immutable attributes can be shared")
    copy.__dict__.update(state)
    return copy


def _empty(t: torch.Tensor) -> torch.Tensor:
    """An uninitialised tensor of ``t``'s shape, dtype and device (contiguous, as ``Linear`` makes them):
    ``torch.empty`` rather than ``empty_like``, whose stride logic on ``meta`` runs in Python."""
    return torch.empty(t.shape, dtype=t.dtype, device=t.device)
