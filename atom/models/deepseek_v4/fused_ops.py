"""Which implementation of the small token-local ops (RMSNorm, weightless RMS normalisation, RoPE) runs.

Outside :func:`fused_small_ops` (the reference model, and the serving model on the torch backend) they are
the torch arithmetic of :mod:`.layers` and :mod:`.rope`, unchanged. Inside it, ``RMSNorm``, ``rms_normalize``
and ``apply_rope`` call the given kernel set's ``rms_norm`` / ``rope`` (one launch each instead of about eight
torch ops). The serving model enters the scope per block on a GPU backend (Triton kernels), where a last-bit
difference from the torch order is accepted; the CPU engine is compared with the reference value for value
and never enters it.
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Iterator

__all__ = ["fused_small_ops", "active_small_ops"]

_KERNELS: ContextVar[Any] = ContextVar("atom_fused_small_ops", default=None)


@contextmanager
def fused_small_ops(kernels: Any) -> Iterator[None]:
    """Run the small ops with ``kernels`` (an ``atom.kernels.backend.KernelSet``) inside this scope."""
    token = _KERNELS.set(kernels)
    try:
        yield
    finally:
        _KERNELS.reset(token)


def active_small_ops() -> Any:
    """The kernel set of the innermost :func:`fused_small_ops` scope, or None (the torch arithmetic)."""
    return _KERNELS.get()
