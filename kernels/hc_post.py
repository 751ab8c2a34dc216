"""mHC's fold of a sub-layer output into the stream (``hc_post``) as one op.

Contract: ``y [T, d]`` (the sub-layer output), ``residual [T, hc, d]`` (the stream before the sub-layer),
``post [T, hc]`` and ``comb [T, hc, hc]`` fp32 (from ``hc_pre``) -> ``h' [T, hc, d]`` of ``residual``'s dtype with
``h'_k = post_k * y + sum_j comb[j, k] * residual_j``, accumulated in fp32 in the reference's order (the post
term first, then ``j = 0, 1, ...``) and cast once. :func:`hc_post_ref` is that loop in torch (``2 + 2 hc`` ops,
the serving block's ``hc_post_accumulate``); :func:`hc_post` is one Triton launch, one program per (tile of
tokens, column tile) holding the ``hc`` rows of each token. Products and sums are the same fp32 operations in the same
order, so the two are equal unless a GPU compiler fuses a multiply and an add (one rounding fewer).
"""

from __future__ import annotations

import torch

from ._common import HAS_TRITON, check_power_of_two, check_same_device, next_pow2, require_triton, triton, tl
from .store_rounding import elements_per_program, rounded_for

__all__ = ["hc_post", "hc_post_ref"]

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _check(y: torch.Tensor, residual: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> None:
    if not isinstance(residual, torch.Tensor) or residual.dim() != 3 or residual.dtype not in _DTYPES:
        got = f"{getattr(residual, 'dtype', type(residual).__name__)} {tuple(getattr(residual, 'shape', ()))}"
        raise ValueError(f"residual must be a [T, hc, d] fp32/bf16/fp16 tensor, got {got}")
    t, hc, d = residual.shape
    if not isinstance(y, torch.Tensor) or y.shape != (t, d) or y.dtype not in _DTYPES:
        raise ValueError(f"y must be a [{t}, {d}] fp32/bf16/fp16 tensor, got {tuple(getattr(y, 'shape', ()))}")
    for name, t_, shape in (("post", post, (t, hc)), ("comb", comb, (t, hc, hc))):
        if not isinstance(t_, torch.Tensor) or t_.shape != shape or t_.dtype != torch.float32:
            raise ValueError(f"{name} must be an fp32 tensor of shape {shape}, got "
                             f"{getattr(t_, 'dtype', type(t_).__name__)} {tuple(getattr(t_, 'shape', ()))}")


def hc_post_ref(y: torch.Tensor, residual: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    """Torch reference of :func:`hc_post` (same contract)."""
    _check(y, residual, post, comb)
    acc = post[:, :, None] * y.float()[:, None, :]
    for j in range(residual.shape[1]):
        acc += comb[:, j, :, None] * residual[:, j].float()[:, None, :]
    return acc.to(residual.dtype)


if HAS_TRITON:

    @triton.jit
    def _hc_post_kernel(y_ptr, r_ptr, post_ptr, comb_ptr, out_ptr, tokens, d, HC: tl.constexpr, BLOCK_T: tl.constexpr,
                        BLOCK: tl.constexpr):
        t = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
        col = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        k = tl.arange(0, HC)
        live = t < tokens
        ok = live[:, None] & (col < d)[None, :]
        y = tl.load(y_ptr + t[:, None] * d + col[None, :], mask=ok, other=0.0).to(tl.float32)
        post = tl.load(post_ptr + t[:, None] * HC + k[None, :], mask=live[:, None], other=0.0)
        acc = post[:, :, None] * y[:, None, :]
        for j in tl.static_range(HC):
            r = tl.load(r_ptr + (t[:, None] * HC + j) * d + col[None, :], mask=ok, other=0.0).to(tl.float32)
            c = tl.load(comb_ptr + (t[:, None] * HC + j) * HC + k[None, :], mask=live[:, None], other=0.0)
            acc += c[:, :, None] * r[:, None, :]
        offs = (t[:, None, None] * HC + k[None, :, None]) * d + col[None, None, :]
        tl.store(out_ptr + offs, rounded_for(acc, out_ptr.dtype.element_ty), mask=ok[:, None, :])


def hc_post(y: torch.Tensor, residual: torch.Tensor, post: torch.Tensor, comb: torch.Tensor) -> torch.Tensor:
    """The new stream ``[T, hc, d]`` (see the module docstring); ``hc`` a power of two; one launch."""
    _check(y, residual, post, comb)
    require_triton("hc_post")
    t, hc, d = residual.shape
    check_power_of_two("hc_post", "hc", hc)
    check_same_device(y=y, residual=residual, post=post, comb=comb)
    r = residual.contiguous()
    out = torch.empty_like(r)
    if t and d:
        block = min(1024, next_pow2(d))
        block_t = max(1, min(next_pow2(t), elements_per_program(r.device) // (hc * block)))
        _hc_post_kernel[(triton.cdiv(t, block_t), triton.cdiv(d, block))](
            y.contiguous(), r, post.contiguous(), comb.contiguous(), out, t, d, HC=hc, BLOCK_T=block_t, BLOCK=block)
    return out
