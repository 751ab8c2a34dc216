"""mHC's sub-layer input (``hc_pre``) as one op: RMS-scaled mixing logits, the three gates, Sinkhorn, the mix.

Contract: ``h [T, hc, d]`` (fp32 / bf16 / fp16, contiguous), ``fn [(2 + hc) * hc, hc * d]`` fp32, ``scale [3]``
and ``base [(2 + hc) * hc]`` fp32, ``iters >= 1``, ``eps`` / ``norm_eps`` floats -> ``(y [T, d]`` of ``h``'s dtype,
``post [T, hc]``, ``comb [T, hc, hc]`` fp32), the reference model's ``hc_pre``:

* ``mix = (fn @ x) * rsqrt(mean(x^2) + norm_eps)`` with ``x = h[t]`` flattened, in fp32;
* ``pre = sigmoid(mix[:hc] * scale[0] + base[:hc]) + eps``, ``post = 2 sigmoid(mix[hc:2hc] * scale[1] + base[hc:2hc])``;
* ``comb``: ``mix[2hc:]`` as ``[hc, hc]`` ``* scale[2] + base[2hc:]``, then the Sinkhorn normalisation of
  :mod:`.hc_sinkhorn` (``iters`` rounds, ``eps``);
* ``y = sum_k pre_k h[t, k]`` in fp32 (k in order), cast once.

The torch version is about twenty ops per call (twice per layer); :func:`hc_pre` is one Triton program per
token: the logits accumulate over column tiles of ``x`` with the sum of squares beside them, the gates and the
Sinkhorn rounds run in registers, then the mix is written tile by tile. The logits' sums run in another order
than torch's GEMM, so the two agree to rounding (the kernel tests bound it).
"""

from __future__ import annotations

import torch

from ._common import HAS_TRITON, check_power_of_two, check_same_device, next_pow2, require_triton, triton, tl
from .hc_sinkhorn import hc_sinkhorn_ref
from .store_rounding import rounded_for

__all__ = ["hc_pre", "hc_pre_ref"]

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _check(h: torch.Tensor, fn: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, iters: int, eps: float,
           norm_eps: float) -> None:
    if not isinstance(h, torch.Tensor) or h.dim() != 3 or h.dtype not in _DTYPES:
        raise ValueError(f"h must be a [T, hc, d] fp32/bf16/fp16 tensor, got "
                         f"{getattr(h, 'dtype', type(h).__name__)} {tuple(getattr(h, 'shape', ()))}")
    _, hc, d = h.shape
    rows = (2 + hc) * hc
    for name, t, shape in (("fn", fn, (rows, hc * d)), ("scale", scale, (3,)), ("base", base, (rows,))):
        if not isinstance(t, torch.Tensor) or t.shape != shape or t.dtype != torch.float32:
            raise ValueError(f"{name} must be an fp32 tensor of shape {shape} for h of shape {tuple(h.shape)}, got "
                             f"{getattr(t, 'dtype', type(t).__name__)} {tuple(getattr(t, 'shape', ()))}")
    if not isinstance(iters, int) or iters < 1:
        raise ValueError(f"iters must be an int >= 1, got {iters!r}")
    for name, v in (("eps", eps), ("norm_eps", norm_eps)):
        if not isinstance(v, float) or not v >= 0:
            raise ValueError(f"{name} must be a float >= 0, got {v!r}")


def hc_pre_ref(h: torch.Tensor, fn: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, iters: int, eps: float,
               norm_eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Torch reference of :func:`hc_pre` (same contract): the reference model's ``hc_pre`` arithmetic."""
    _check(h, fn, scale, base, iters, eps, norm_eps)
    hc = h.shape[1]
    x = h.flatten(1).float()
    mix = torch.nn.functional.linear(x, fn) * torch.rsqrt(x.square().mean(-1, keepdim=True) + norm_eps)
    pre = torch.sigmoid(mix[:, :hc] * scale[0] + base[:hc]) + eps
    post = 2 * torch.sigmoid(mix[:, hc:2 * hc] * scale[1] + base[hc:2 * hc])
    comb = mix[:, 2 * hc:].reshape(-1, hc, hc) * scale[2] + base[2 * hc:].reshape(hc, hc)
    y = (pre[:, :, None] * h.float()).sum(dim=1)
    return y.to(h.dtype), post, hc_sinkhorn_ref(comb.contiguous(), iters, eps)


if HAS_TRITON:

    @triton.jit
    def _hc_pre_kernel(h_ptr, fn_ptr, scale_ptr, base_ptr, y_ptr, post_ptr, comb_ptr, d, iters, eps, norm_eps,
                       HC: tl.constexpr, BLOCK: tl.constexpr):
        t = tl.program_id(0).to(tl.int64)
        k = tl.arange(0, HC)
        col = tl.arange(0, BLOCK)
        width = HC * d
        acc_pre = tl.zeros((HC,), tl.float32)
        acc_post = tl.zeros((HC,), tl.float32)
        acc_comb = tl.zeros((HC, HC), tl.float32)
        sq = tl.zeros((BLOCK,), tl.float32)
        for c0 in range(0, width, BLOCK):
            c = c0 + col
            ok = c < width
            x = tl.load(h_ptr + t * width + c, mask=ok, other=0.0).to(tl.float32)
            sq += x * x
            f_pre = tl.load(fn_ptr + k[:, None] * width + c[None, :], mask=ok[None, :], other=0.0)
            f_post = tl.load(fn_ptr + (HC + k[:, None]) * width + c[None, :], mask=ok[None, :], other=0.0)
            row = 2 * HC + k[:, None, None] * HC + k[None, :, None]
            f_comb = tl.load(fn_ptr + row * width + c[None, None, :], mask=ok[None, None, :], other=0.0)
            acc_pre += tl.sum(f_pre * x[None, :], axis=1)
            acc_post += tl.sum(f_post * x[None, :], axis=1)
            acc_comb += tl.sum(f_comb * x[None, None, :], axis=2)
        inv = 1.0 / tl.sqrt(tl.sum(sq, axis=0) / width + norm_eps)
        s0 = tl.load(scale_ptr)
        s1 = tl.load(scale_ptr + 1)
        s2 = tl.load(scale_ptr + 2)
        pre = tl.sigmoid(acc_pre * inv * s0 + tl.load(base_ptr + k)) + eps
        post = 2.0 * tl.sigmoid(acc_post * inv * s1 + tl.load(base_ptr + HC + k))
        tl.store(post_ptr + t * HC + k, post)
        m = acc_comb * inv * s2 + tl.load(base_ptr + 2 * HC + k[:, None] * HC + k[None, :])
        m = tl.exp(m - tl.max(m, axis=1)[:, None])
        m = m / tl.sum(m, axis=1)[:, None] + eps
        m = m / (tl.sum(m, axis=0)[None, :] + eps)
        for _ in range(iters - 1):
            m = m / (tl.sum(m, axis=1)[:, None] + eps)
            m = m / (tl.sum(m, axis=0)[None, :] + eps)
        tl.store(comb_ptr + t * HC * HC + k[:, None] * HC + k[None, :], m)
        for c0 in range(0, d, BLOCK):
            c = c0 + col
            ok = c < d
            rows = tl.load(h_ptr + t * width + k[:, None] * d + c[None, :], mask=ok[None, :], other=0.0)
            y = tl.sum(pre[:, None] * rows.to(tl.float32), axis=0)
            tl.store(y_ptr + t * d + c, rounded_for(y, y_ptr.dtype.element_ty), mask=ok)


def hc_pre(h: torch.Tensor, fn: torch.Tensor, scale: torch.Tensor, base: torch.Tensor, iters: int, eps: float,
           norm_eps: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(y, post, comb)`` of the stream ``h`` (see the module docstring); ``hc`` a power of two; one launch."""
    _check(h, fn, scale, base, iters, eps, norm_eps)
    require_triton("hc_pre")
    t, hc, d = h.shape
    check_power_of_two("hc_pre", "hc", hc)
    check_same_device(h=h, fn=fn, scale=scale, base=base)
    hh = h.contiguous()
    y = torch.empty(t, d, dtype=h.dtype, device=h.device)
    post = torch.empty(t, hc, dtype=torch.float32, device=h.device)
    comb = torch.empty(t, hc, hc, dtype=torch.float32, device=h.device)
    if t:
        block = min(256, next_pow2(hc * d))
        _hc_pre_kernel[(t,)](hh, fn.contiguous(), scale.contiguous(), base.contiguous(), y, post, comb, d, iters,
                             eps, norm_eps, HC=hc, BLOCK=block)
    return y, post, comb
