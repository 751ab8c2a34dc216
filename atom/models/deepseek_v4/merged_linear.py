"""Several Linears that read the same input, multiplied as one GEMM.

``MergedLinear(a, b, ...)(x)`` returns ``(a(x), b(x), ...)``. Unbound (and wherever a merge is refused) it calls
the parts one by one, so a model that never binds it computes exactly what its Linears compute. After
:meth:`MergedLinear.bind` with ``merge=True`` it holds one Linear whose weight is the parts' weights
concatenated along the output dim, built once (at bind time, never per step), and returns column views of that
one product: one GEMM launch instead of one per part. The attention's ``wq_a`` and ``wkv`` (both read the
attention-normed input) and the shared expert's ``w1`` and ``w3`` are such groups.

What may be merged (:func:`merge_refusal` says why not, and the parts then stay separate GEMMs):

* every part a plain :class:`~.layers.Linear` (a subclass may override ``forward`` or ``quantize_input``) of the
  same ``in_features``, storage format, compute dtype, activation block (``act_block``) and bound GEMM (the same
  ``gemm`` and ``w8a8`` kernels), with its parameters on one device;
* ``fp8`` (weight ``[out, in]`` e4m3, one e8m0 scale per 128 x 128 block): every part but the last starts and
  ends on a scale-block boundary (``out_features`` a multiple of 128), so the concatenated scales are the
  scales of the concatenated weight;
* ``dense`` and ``mxfp4`` (one scale per output row and 32 inputs) concatenate row by row without condition.

The merged product runs the parts' own kernels (the weight-only GEMM, or on the W8A8 path ``fp8_act_quant`` /
the FP8 rows a fused norm attached to ``x``, then ``w8a8_block_gemm``), so each output column is the dot product
the part would compute; only a GEMM's choice of summation order for a wider output can move a last bit.

Memory: after the merge each part's parameters are views into the merged tensors (the checkpoint names,
shapes and values are unchanged; a ``load_state_dict`` into the model writes through to the merged weight).
Moving or replacing the parts' parameters afterwards (``.to()``, ``set_format``) detaches them: bind again.
"""

from __future__ import annotations

import torch
from torch import nn

from .layers import Linear

__all__ = ["MergedLinear", "merge_refusal", "FP8_WEIGHT_BLOCK"]

#: the output rows (and inputs) that share one scale of an FP8 block-scaled weight
FP8_WEIGHT_BLOCK = 128


def merge_refusal(parts: tuple[Linear, ...]) -> str | None:
    """Why ``parts`` cannot be one GEMM (module docstring), or None when they can."""
    if len(parts) < 2:
        return "fewer than two parts"
    first = parts[0]
    for p in parts:
        if type(p) is not Linear:
            return f"{type(p).__name__} is not a plain Linear"
        if (p.in_features, p.fmt, p.dtype, p.act_block) != (first.in_features, first.fmt, first.dtype,
                                                            first.act_block):
            return "the parts differ in in_features, format, dtype or activation block"
        if p.gemm is not first.gemm or p.w8a8 != first.w8a8:
            return "the parts are bound to different GEMM kernels"
        tensors = [p.weight] if p.scale is None else [p.weight, p.scale]
        if any(t.device != first.weight.device or t.device.type == "meta" for t in tensors):
            return "the parts' parameters are not on one (real) device"
    if first.fmt == "fp8" and any(p.out_features % FP8_WEIGHT_BLOCK for p in parts[:-1]):
        return f"an fp8 part other than the last has out_features not a multiple of {FP8_WEIGHT_BLOCK}"
    return None


class MergedLinear:
    """The parts' products from one GEMM when bound with ``merge=True`` (module docstring).

    Not an ``nn.Module``: it owns no parameter of its own (the parts keep theirs, under their checkpoint names),
    so holding it on a module adds nothing to its ``state_dict``.
    """

    def __init__(self, *parts: Linear) -> None:
        if not parts or not all(isinstance(p, Linear) for p in parts):
            raise TypeError("MergedLinear takes one or more Linear modules")
        self.parts = parts
        self.sizes = tuple(p.out_features for p in parts)
        self.merged: Linear | None = None
        #: why the last bind left the parts separate (None: merged, or never asked to merge)
        self.refusal: str | None = None

    def bind(self, merge: bool) -> None:
        """Concatenate the parts' weights into one Linear (``merge``; once, after loading and ``bind_gemm``), or
        go back to one GEMM per part. A refused merge (:func:`merge_refusal`) leaves the parts separate."""
        self.merged, self.refusal = None, None
        if not merge:
            return
        self.refusal = merge_refusal(self.parts)
        if self.refusal is None:
            self.merged = _concatenated(self.parts)

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``(part(x) for each part)``: column views of one product when merged (strided for more than one row)."""
        if self.merged is None:
            return tuple(p(x) for p in self.parts)
        return self.merged(x).split(self.sizes, dim=-1)


def _concatenated(parts: tuple[Linear, ...]) -> Linear:
    """One Linear over the parts' weights stacked along the output dim; the parts' parameters become views of it."""
    first, total = parts[0], sum(p.out_features for p in parts)
    merged = Linear(first.in_features, total, dtype=first.dtype, device="meta")
    merged.fmt, merged.act_block, merged.gemm, merged.w8a8 = first.fmt, first.act_block, first.gemm, first.w8a8
    weight = torch.cat([p.weight.detach() for p in parts], dim=0)
    merged.weight = nn.Parameter(weight, requires_grad=False)
    _share(parts, "weight", weight, [p.weight.shape[0] for p in parts])
    if first.scale is not None:
        scale = torch.cat([p.scale.detach() for p in parts], dim=0)
        merged.scale = nn.Parameter(scale, requires_grad=False)
        _share(parts, "scale", scale, [p.scale.shape[0] for p in parts])
    return merged


def _share(parts: tuple[Linear, ...], name: str, whole: torch.Tensor, rows: list[int]) -> None:
    """Point each part's parameter ``name`` at its rows of ``whole`` (same values: no second copy is kept)."""
    for p, view in zip(parts, whole.split(rows, dim=0)):
        getattr(p, name).data = view
