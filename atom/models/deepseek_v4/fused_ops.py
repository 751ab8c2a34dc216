"""Which implementation of the small token-local ops (RMSNorm, weightless RMS normalisation, RoPE) a module runs,
bound once like the GEMMs (``Linear.bind_gemm``), never looked up per call.

A module whose forward runs one of them is a :class:`SmallOpsUser` and holds :attr:`SmallOpsUser.small_ops`: None
(the default: the torch arithmetic of :mod:`.layers` and :mod:`.rope`, unchanged) or a kernel set (an
``atom.kernels.backend.KernelSet``) whose ``rms_norm`` / ``rope`` / ``rms_norm_rope`` it calls (one launch each
instead of a chain of torch ops). :func:`bind_small_ops` sets it on every such module under a root. The free
functions (``rms_normalize``, ``apply_rope``, ``normed_rope``) take the kernel set as an argument, passed by the
module that calls them. The reference model never binds one; the serving model binds :func:`fused_small_ops_for`
of its kernel set when it binds the arena: the Triton kernels on a GPU backend, where a last-bit difference from
the torch order is accepted; None on the torch backend, whose engine is compared with the reference value for value.

A norm that feeds FP8 linears (the W8A8 path of :class:`~.layers.Linear`) may also quantize its output in the same
launch (``rms_norm_fp8``): :func:`attach_fp8_input` hangs the FP8 rows and scales on the output tensor itself, and a
linear given exactly that tensor object (:func:`attached_fp8_input`) multiplies them instead of quantizing again.
Any other tensor (a view, a slice, a copy) carries nothing, so a consumer never takes the quantization of
different values; norm outputs are fresh tensors that nothing writes in place.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    from atom.kernels.backend import KernelSet

__all__ = ["SmallOpsUser", "bind_small_ops", "fused_small_ops_for", "attach_fp8_input", "attached_fp8_input"]


class SmallOpsUser:
    """Mixin of a module whose forward runs small token-local ops (put it before ``nn.Module`` in the bases)."""

    #: the kernel set whose fused small ops this module calls; None: the torch arithmetic (set by
    #: :func:`bind_small_ops`; a class default, so an unbound module costs no attribute of its own)
    small_ops: KernelSet | None = None


def bind_small_ops(root: nn.Module, kernels: KernelSet | None) -> None:
    """Bind ``kernels`` (None: the torch arithmetic) as :attr:`SmallOpsUser.small_ops` of every module under
    ``root``, ``root`` included. Bind again after replacing such a module."""
    for module in root.modules():
        if isinstance(module, SmallOpsUser):
            module.small_ops = kernels


def fused_small_ops_for(kernels: KernelSet | None) -> KernelSet | None:
    """The kernel set a model runs its small ops with when its other ops are ``kernels``': ``kernels`` itself on a
    GPU backend (its ``rms_norm`` is a kernel), None on the torch backend, which keeps the reference's torch
    arithmetic op for op."""
    if kernels is None or kernels.sources["rms_norm"] == "torch":
        return None
    return kernels


_FP8_ATTR = "_atom_fp8_input"


def attach_fp8_input(y: torch.Tensor, block: int, xq: torch.Tensor, xs: torch.Tensor) -> torch.Tensor:
    """Record on ``y`` its FP8 quantization in blocks of ``block`` (``xq``, ``xs`` as ``fp8_act_quant`` makes them
    for ``y.reshape(-1, y.shape[-1])``); returns ``y``."""
    setattr(y, _FP8_ATTR, (block, xq, xs))
    return y


def attached_fp8_input(x: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(xq, xs)`` recorded on this very tensor for activation blocks of ``block``, else None."""
    hit: Any = getattr(x, _FP8_ATTR, None)
    if hit is None or hit[0] != block:
        return None
    return hit[1], hit[2]
