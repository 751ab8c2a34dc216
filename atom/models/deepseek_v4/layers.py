"""Small building blocks shared by every DeepSeek-V4 module: Linear, RMSNorm, Embedding.

Parameters are created with ``torch.empty`` (no initialisation), so a model can be built on the ``meta`` device
without allocating memory; weights come from a checkpoint or from ``checkpoint.random_state_dict``.  A Linear
can keep the release's FP8 or MXFP4 weight (``Linear.set_format``).

Batch invariance: ``map_rows(fn, True, ...)`` applies a token-local function to one token at a time, so every
GEMM becomes a GEMV and every elementwise kernel (whose SIMD / scalar-tail split depends on the tensor size) sees
the same shape whether a token is computed alone (decode) or among many (prefill).  The model routes all
token-local work through it when ``cfg.batch_invariant`` is set.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import torch
import torch.nn.functional as F
from torch import nn

from .fused_ops import SmallOpsUser, attach_fp8_input, attached_fp8_input
from .quant import act_quant_block, fp8_roundtrip

if TYPE_CHECKING:
    from atom.kernels.backend import KernelSet


def map_rows(fn: Callable[..., Any], row_wise: bool, *args: torch.Tensor | None) -> Any:
    """``fn(*args)``; with ``row_wise``, ``fn`` runs on each leading row ``[i:i+1]`` of every tensor argument and
    the outputs (a tensor, ``None`` or a tuple / NamedTuple of them) are concatenated along dim 0."""
    if not row_wise:
        return fn(*args)
    n = next(a.shape[0] for a in args if a is not None)
    return _concat([fn(*(None if a is None else a[i : i + 1] for a in args)) for i in range(n)])


def _concat(outs: list[Any]) -> Any:
    first = outs[0]
    if first is None:
        return None
    if isinstance(first, tuple):
        parts = [_concat([o[k] for o in outs]) for k in range(len(first))]
        return type(first)(*parts) if hasattr(first, "_fields") else tuple(parts)
    return torch.cat(outs, 0)


#: Weight storage formats of a Linear: parameter dtypes and the kernel op that multiplies with it.
WEIGHT_FORMATS = ("dense", "fp8", "mxfp4")
_FORMAT_OPS = {"fp8": "fp8_block_gemm", "mxfp4": "mxfp4_gemm"}


class Linear(nn.Module):
    """A bias-free linear layer ``y = x W^T`` whose weight may stay quantized as stored in the release.

    Formats (``set_format``):

    * ``dense``: ``weight [out, in]`` in ``dtype``; the input is cast to it (the compressor runs its projections
      in fp32).
    * ``fp8``: ``weight [out, in]`` ``float8_e4m3fn`` and ``scale [ceil(out/128), ceil(in/128)]`` e8m0.
    * ``mxfp4``: ``weight [out, in/2]`` ``uint8`` (packed e2m1 pairs) and ``scale [out, in/32]`` e8m0.

    A quantized layer multiplies through one kernel op (``fp8_block_gemm`` / ``mxfp4_gemm``, the torch
    reference until :meth:`bind_gemm` binds the backend's), computes in ``dtype`` and, when ``act_quant`` is
    set, first round-trips its input through FP8 as the official forward does.

    W8A8 (:attr:`w8a8` set by :meth:`bind_gemm`): an FP8 layer with ``act_quant`` bound to a GPU backend (Triton or
    aiter) quantizes its input once (``fp8_act_quant``, or the FP8 rows a fused norm attached to it) and multiplies
    the FP8 activations on FP8 tensor cores (``w8a8_block_gemm``): the same exact products as the round trip and
    the weight-only GEMM, summed in another fp32 order (:mod:`atom.kernels.w8a8_gemm`). The torch backend (the
    CPU engine, compared with the reference model value for value) keeps the round trip and the weight-only GEMM,
    and so does a layer whose input blocks span ranks (a :meth:`quantize_input` override).
    """

    def __init__(self, in_features: int, out_features: int, *,
                 dtype: torch.dtype | None = None, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.dtype = dtype if dtype is not None else torch.get_default_dtype()
        self.fmt, self.act_block = "dense", 0
        self.gemm: Callable[..., torch.Tensor] | None = None
        self.w8a8: tuple[Callable[..., Any], Callable[..., torch.Tensor]] | None = None  # (fp8_act_quant, GEMM)
        self.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=dtype, device=device))
        self.scale: nn.Parameter | None = None

    def set_format(self, fmt: str, *, act_quant: bool = False) -> None:
        """Replace the parameters by empty ones of storage ``fmt`` (on the same device; free on ``meta``)."""
        if fmt not in WEIGHT_FORMATS:
            raise ValueError(f"weight format {fmt!r} is not one of {', '.join(WEIGHT_FORMATS)}")
        dev, n, k = self.weight.device, self.out_features, self.in_features
        self.fmt = fmt
        if fmt == "dense":
            self.weight = nn.Parameter(torch.empty(n, k, dtype=self.dtype, device=dev))
            self.scale, self.gemm, self.act_block = None, None, 0
            return
        if fmt == "fp8":
            shapes = ((n, k), torch.float8_e4m3fn, (-(-n // 128), -(-k // 128)))
        else:
            if k % 32:
                raise ValueError(f"an mxfp4 weight needs in_features divisible by 32, got {k}")
            shapes = ((n, k // 2), torch.uint8, (n, k // 32))
        w_shape, w_dtype, s_shape = shapes
        self.weight = nn.Parameter(torch.empty(w_shape, dtype=w_dtype, device=dev), requires_grad=False)
        self.scale = nn.Parameter(torch.empty(s_shape, dtype=torch.float8_e8m0fnu, device=dev), requires_grad=False)
        self.act_block = act_quant_block(k) if act_quant else 0
        self.bind_gemm(None)

    @property
    def gemm_op(self) -> str | None:
        """The kernel op this layer multiplies with (None for dense weights)."""
        return _FORMAT_OPS.get(self.fmt)

    def bind_gemm(self, kernels: Any) -> None:
        """Multiply with ``kernels``' implementation of :attr:`gemm_op` (None: the torch reference)."""
        op = self.gemm_op
        self.w8a8 = None
        if op is None:
            return
        if kernels is None:
            from atom.kernels.backend import get_kernel

            self.gemm = get_kernel(op, "torch")
            return
        self.gemm = getattr(kernels, op)
        if self.fmt == "fp8" and self.act_block >= 16 and self.dtype in (torch.float32, torch.bfloat16) \
                and type(self).quantize_input is Linear.quantize_input \
                and getattr(kernels, "sources", {}).get("w8a8_block_gemm", "torch") != "torch":
            self.w8a8 = (kernels.fp8_act_quant, kernels.w8a8_block_gemm)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.fmt == "dense":
            return F.linear(x.to(self.weight.dtype), self.weight)
        assert self.gemm is not None and self.scale is not None
        if self.w8a8 is not None:
            return self._forward_w8a8(x)
        x2 = x.to(self.dtype).reshape(-1, self.in_features)
        if self.act_block:
            x2 = self.quantize_input(x2)
        return self.gemm(x2, self.weight, self.scale).reshape(*x.shape[:-1], self.out_features)

    def _forward_w8a8(self, x: torch.Tensor) -> torch.Tensor:
        """FP8 activations (attached by a fused norm, else quantized here) times the FP8 weight."""
        quantize, gemm = self.w8a8
        given = attached_fp8_input(x, self.act_block) if x.dtype == self.dtype else None
        xq, xs = given if given is not None else quantize(x.to(self.dtype).reshape(-1, self.in_features),
                                                          self.act_block)
        return gemm(xq, xs, self.weight, self.scale, self.dtype).reshape(*x.shape[:-1], self.out_features)

    def quantize_input(self, x: torch.Tensor) -> torch.Tensor:
        """The FP8 round-trip of the GEMM input ``x [M, in]`` in blocks of ``act_block`` inputs (a layer whose
        inputs are split across ranks overrides it: its blocks may span ranks)."""
        return fp8_roundtrip(x, self.act_block)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, fmt={self.fmt}"


class RMSNorm(SmallOpsUser, nn.Module):
    """Weighted RMSNorm over the last dim, computed in fp32: ``x * rsqrt(mean(x^2) + eps) * weight``; with a
    bound kernel set (:attr:`small_ops`, see :mod:`.fused_ops`) its ``rms_norm`` kernel instead."""

    def __init__(self, dim: int, eps: float, *, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim, dtype=dtype, device=device))
        #: the activation block of the W8A8 linears this norm feeds (0: none); with a bound kernel set the norm
        #: then also quantizes its output in the same launch (``rms_norm_fp8``) and attaches it for them
        self.fp8_block = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kernels = self.small_ops
        if kernels is not None and self.fp8_block:
            y, xq, xs = kernels.rms_norm_fp8(x.reshape(-1, x.shape[-1]), self.weight, self.eps, self.fp8_block)
            return attach_fp8_input(y.view(x.shape), self.fp8_block, xq, xs)
        if kernels is not None:  # a GPU backend's fused kernel (see fused_ops.py)
            return kernels.rms_norm(x, self.weight, self.eps)
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + self.eps)
        return (x * self.weight.float()).to(dtype)


def rms_normalize(x: torch.Tensor, eps: float, *, kernels: KernelSet | None = None) -> torch.Tensor:
    """RMS normalisation without weight over the last dim (per-head query norm, mHC input norm); ``kernels``: the
    caller's bound kernel set (:attr:`~.fused_ops.SmallOpsUser.small_ops`), whose ``rms_norm`` then runs; None:
    the torch arithmetic."""
    if kernels is not None:
        return kernels.rms_norm(x, None, eps)
    return x * torch.rsqrt(x.square().mean(-1, keepdim=True) + eps)


class Embedding(nn.Module):
    """Token embedding table ``weight: [vocab_size, dim]``."""

    def __init__(self, vocab_size: int, dim: int, *, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, dim, dtype=dtype, device=device))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight)
