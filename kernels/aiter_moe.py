"""aiter (ROCm) implementation of the ``fused_moe`` op, registered by :mod:`.backend` when aiter imports.

It has not been run: this project has no ROCm machine, and ``import aiter`` fails on a CPU. The argument
mapping onto ``aiter.fused_moe.fused_moe(hidden_states, w1, w2, topk_weight, topk_ids, expert_mask=None,
activation=ActivationType.Silu, quant_type=QuantType.No, doweight_stage1=False, w1_scale=None,
w2_scale=None, ...)``:

* ``hidden_states`` = ``x`` (bf16); ``topk_weight`` = ``route_w``, ``topk_ids`` = ``route_idx`` (int32);
* ``w1`` = ``cat(w1, w3)`` per expert, ``[E, 2I, D]`` (aiter's gate-then-up layout; concatenated once per
  weight and kept), ``w2`` = ``w2``; scales likewise (``w1_scale`` = ``cat(s1, s3)`` as fp32);
* ``quant_type``: ``QuantType.No`` (dense), ``QuantType.per_1x128`` (FP8 128 x 128 blocks),
  ``QuantType.per_1x32`` (MXFP4, one scale per 32 inputs);
* ``doweight_stage1=True``: the routing weight multiplies ``h`` before ``w2``, as here;
* an expert-parallel rank passes ``expert_mask`` (1 for the experts it holds) instead of ``first_expert``.

What does not map: aiter's ``Silu`` activation has no SwiGLU clamp, and its FP8 path quantizes activations
with its own per-token scales rather than ``act_blocks`` power-of-two blocks. A call with ``limit > 0`` or
nonzero ``act_blocks`` or an ``h_quant`` hook (every DeepSeek-V4 layer) therefore runs the Triton wrapper; the
aiter kernel takes only the unclamped, unquantized-activation case. ``shared`` (the shared expert's output the
routed sum is added onto) has no aiter argument: it is added to aiter's output after the call.
"""

from __future__ import annotations

import importlib
from typing import Callable

import torch

from .fused_moe import expert_format, fused_moe
from .quant_formats import e8m0_to_float

__all__ = ["fused_moe_aiter"]

_CAT_CACHE: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]] = {}


def _gate_up(w1: torch.Tensor, w3: torch.Tensor, s1: torch.Tensor | None, s3: torch.Tensor | None
             ) -> tuple[torch.Tensor, torch.Tensor | None]:
    key = (w1.data_ptr(), w3.data_ptr())
    hit = _CAT_CACHE.get(key)
    if hit is None or hit[0] is not w1:
        scale = None if s1 is None else torch.cat((e8m0_to_float(s1), e8m0_to_float(s3)), 1)
        hit = (w1, torch.cat((w1, w3), 1), scale)
        _CAT_CACHE[key] = hit
    return hit[1], hit[2]


def fused_moe_aiter(x, route_w, route_idx, w1, w3, w2, s1=None, s3=None, s2=None, *, limit: float,
                    act_blocks: tuple[int, int] = (0, 0), first_expert: int = 0,
                    h_quant: Callable[[torch.Tensor], torch.Tensor] | None = None,
                    shared: torch.Tensor | None = None) -> torch.Tensor:
    """The ``fused_moe`` contract through aiter where it maps (module docstring), else the Triton wrapper
    (always with ``h_quant``: aiter's kernel has no hook between its two GEMMs)."""
    if limit > 0 or any(act_blocks) or h_quant is not None or x.dtype != torch.bfloat16:
        return fused_moe(x, route_w, route_idx, w1, w3, w2, s1, s3, s2, limit=limit, act_blocks=act_blocks,
                         first_expert=first_expert, h_quant=h_quant, shared=shared)
    aiter = importlib.import_module("aiter")
    moe = importlib.import_module("aiter.fused_moe")
    quant = {"dense": aiter.QuantType.No, "fp8": aiter.QuantType.per_1x128,
             "mxfp4": aiter.QuantType.per_1x32}[expert_format(w1)]
    w13, s13 = _gate_up(w1, w3, s1, s3)
    if first_expert:
        raise ValueError("fused_moe_aiter: expert-parallel ranks need an expert mask over the global ids; "
                         "the Triton wrapper takes first_expert")
    out = moe.fused_moe(x, w13, w2, route_w, route_idx.to(torch.int32), 
                        activation=aiter.ActivationType.Silu, quant_type=quant, doweight_stage1=True,
                        w1_scale=s13, w2_scale=None if s2 is None else e8m0_to_float(s2))
    return out.float() if shared is None else out.float() + shared.float()
