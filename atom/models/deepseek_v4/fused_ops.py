"""Which implementation of the small token-local ops (RMSNorm, weightless RMS normalisation, RoPE) runs.

Outside :func:`fused_small_ops` (the reference model, and the serving model on the torch backend) they are
the torch arithmetic of :mod:`.layers` and :mod:`.rope`, unchanged. Inside it, ``RMSNorm``, ``rms_normalize``,
``apply_rope`` and ``normed_rope`` call the given kernel set's ``rms_norm`` / ``rope`` / ``rms_norm_rope`` (one
launch each instead of a chain of torch ops). The serving model enters the scope per block on a GPU backend
(Triton kernels), where a last-bit difference from the torch order is accepted; the CPU engine is compared with
the reference value for value and never enters it.

A norm that feeds FP8 linears (the W8A8 path of :class:`~.layers.Linear`) may also quantize its output in the same
launch (``rms_norm_fp8``): :func:`attach_fp8_input` hangs the FP8 rows and scales on the output tensor itself, and a
linear given exactly that tensor object (:func:`attached_fp8_input`) multiplies them instead of quantizing again.
Any other tensor (a view, a slice, a copy) carries nothing, so a consumer never takes the quantization of
different values; norm outputs are fresh tensors that nothing writes in place.
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Iterator

import torch

__all__ = ["fused_small_ops", "active_small_ops", "attach_fp8_input", "attached_fp8_input"]

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


_FP8_ATTR = "_atom_fp8_input"


def attach_fp8_input(y: torch.Tensor, block: int, xq: torch.Tensor, xs: torch.Tensor) -> torch.Tensor:
    """Record on ``y`` its FP8 quantization in blocks of ``block`` (``xq``, ``xs`` as ``fp8_act_quant`` makes them
    for ``y.reshape(-1, y.shape[-1])``); returns ``y``."""
    setattr(y, _FP8_ATTR, (block, xq, xs))
    return y


def attached_fp8_input(x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(xq, xs)`` recorded on this very tensor for activation blocks of ``block``, else None."""
    hit = getattr(x, _FP8_ATTR, None)
    if hit is None or hit[0] != block:
        return None
    return hit[1], hit[2]
