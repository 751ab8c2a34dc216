"""The mHC Sinkhorn normalisation of every token's ``hc x hc`` mixing matrix, as one op.

Contract: ``comb [T, hc, hc]`` fp32 logits (already scaled and biased) ->
``c = softmax(comb, -1) + eps``; ``c = c / (colsum(c) + eps)``; then ``iters - 1`` rounds of
``c = c / (rowsum(c) + eps)``; ``c = c / (colsum(c) + eps)`` (rowsum over the last dim, colsum over
dim -2), fp32. This is the only mHC step whose cost in ops grows with the iteration count, so it is
one op: :func:`hc_sinkhorn_ref` (the torch reference, a loop) and :func:`hc_sinkhorn` (one Triton
program per block of tokens, the iterations in registers) share the contract.

``torch.ops.atom.hc_sinkhorn`` is the entry point the model calls. It is a registered torch op so
that (a) it is one op to the dispatcher (a step's op count does not scale with ``iters``) and (b) the
model, which runs inside token-local code that holds no kernel set, gets the Triton body on CUDA
tensors and :func:`hc_sinkhorn_cpu` elsewhere. The Triton body is the same arithmetic in the same
order per element; exp and division may differ from torch's in the last bit, so the GPU test compares
within 1e-6.

:func:`hc_sinkhorn_cpu` equals the reference bit for bit at well under half its host cost: a decode step
calls the op twice per layer on a few tokens, where the reference's ``6 * iters`` torch ops (each a
few microseconds of dispatch for 16 numbers a token) were a tenth of the CPU step. It takes torch's
softmax, then runs the normalisation loop in numpy on the same memory, in place. Every float32
rounding is the reference's: ``+ eps`` and the division round alike, and a sum over ``hc <= 4``
entries adds them one after another, ``((c0 + c1) + c2) + c3``, in torch's CPU ``sum`` (its cascade
starts at 16 entries) and in numpy's ``add.reduce`` (its pairwise summation starts at 8), along
either dimension; the kernel test checks this on random inputs and on inputs where any other order
rounds differently. The op is declared with
``torch.library.Library``, whose Python kernels are called from the dispatcher directly (a
``custom_op`` adds an autograd and compile wrapper of about 10 us a call; the op has no gradient).
"""

from __future__ import annotations

import numpy as np
import torch

from ._common import HAS_TRITON, check_positive, check_power_of_two, check_rows, require_triton, triton, tl
from .tiles import tiles_for

__all__ = ["hc_sinkhorn", "hc_sinkhorn_cpu", "hc_sinkhorn_ref"]


def _check(comb: torch.Tensor, iters: int, eps: float) -> None:
    check_rows("comb", comb, ndim=3, dtype=torch.float32)
    if comb.shape[1] != comb.shape[2]:
        raise ValueError(f"comb must be [T, hc, hc], got shape {tuple(comb.shape)}")
    check_positive("iters", iters)
    if not isinstance(eps, float) or not eps >= 0:
        raise ValueError(f"eps must be a float >= 0, got {eps!r}")


def hc_sinkhorn_ref(comb: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """Torch reference of :func:`hc_sinkhorn` (same contract)."""
    _check(comb, iters, eps)
    c = comb.softmax(dim=-1) + eps
    c = c / (c.sum(dim=-2, keepdim=True) + eps)
    for _ in range(iters - 1):
        c = c / (c.sum(dim=-1, keepdim=True) + eps)
        c = c / (c.sum(dim=-2, keepdim=True) + eps)
    return c


#: the widest ``hc`` whose sums both torch (below 16 entries) and numpy (below 8) add one after another on the CPU;
#: wider matrices take the reference
_SEQUENTIAL_SUM_MAX = 4


def hc_sinkhorn_cpu(comb: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """:func:`hc_sinkhorn_ref` on a CPU tensor, bit for bit, with three numpy calls per normalisation instead of
    three torch ops (see the module docstring): torch's softmax, then per normalisation one ``add.reduce`` into
    a ``[T, hc]`` buffer, ``+ eps`` there, and one in-place division. ``hc`` above 4 runs the reference."""
    _check(comb, iters, eps)
    if comb.device.type != "cpu":
        raise ValueError(f"hc_sinkhorn_cpu takes a CPU tensor, got one on {comb.device}")
    if comb.shape[1] > _SEQUENTIAL_SUM_MAX:
        return hc_sinkhorn_ref(comb, iters, eps)
    c = comb.softmax(dim=-1).add_(eps).contiguous().numpy()
    e = np.float32(eps)
    t, n = c.shape[:2]
    col_sums = np.empty((t, 1, n), dtype=np.float32)  # over dim -2
    row_sums = np.empty((t, n, 1), dtype=np.float32)  # over dim -1
    add, divide, reduce = np.add, np.divide, np.add.reduce
    reduce(c, axis=1, out=col_sums, keepdims=True)
    divide(c, add(col_sums, e, out=col_sums), out=c)
    for _ in range(iters - 1):
        reduce(c, axis=2, out=row_sums, keepdims=True)
        divide(c, add(row_sums, e, out=row_sums), out=c)
        reduce(c, axis=1, out=col_sums, keepdims=True)
        divide(c, add(col_sums, e, out=col_sums), out=c)
    return torch.from_numpy(c)


if HAS_TRITON:

    @triton.jit
    def _hc_sinkhorn_kernel(in_ptr, out_ptr, num_tokens, iters, eps, HC: tl.constexpr, BLOCK_T: tl.constexpr):
        t = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
        r = tl.arange(0, HC)
        offs = t[:, None, None] * (HC * HC) + r[None, :, None] * HC + r[None, None, :]
        ok = (t < num_tokens)[:, None, None] & (offs >= 0)
        x = tl.load(in_ptr + offs, mask=ok, other=0.0)
        x = tl.exp(x - tl.max(x, axis=2)[:, :, None])
        c = x / tl.sum(x, axis=2)[:, :, None] + eps
        c = c / (tl.sum(c, axis=1)[:, None, :] + eps)
        for _ in range(iters - 1):
            c = c / (tl.sum(c, axis=2)[:, :, None] + eps)
            c = c / (tl.sum(c, axis=1)[:, None, :] + eps)
        tl.store(out_ptr + offs, c, mask=ok)


def hc_sinkhorn(comb: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    """Sinkhorn-normalised ``[T, hc, hc]`` mixing matrices (see the module docstring); ``hc`` a power of 2."""
    _check(comb, iters, eps)
    require_triton("hc_sinkhorn")
    hc = comb.shape[1]
    check_power_of_two("hc_sinkhorn", "hc", hc)
    x = comb.contiguous()
    out = torch.empty_like(x)
    if x.shape[0]:
        block = tiles_for(x.device).sinkhorn_tokens
        _hc_sinkhorn_kernel[(triton.cdiv(x.shape[0], block),)](x, out, x.shape[0], iters, eps, HC=hc, BLOCK_T=block)
    return out


_LIB = torch.library.Library("atom", "FRAGMENT")
_LIB.define("hc_sinkhorn(Tensor comb, int iters, float eps) -> Tensor")
_LIB.impl("hc_sinkhorn", hc_sinkhorn_cpu, "CPU")


@torch.library.register_fake("atom::hc_sinkhorn", lib=_LIB)
def _(comb: torch.Tensor, iters: int, eps: float) -> torch.Tensor:
    return torch.empty_like(comb)


if HAS_TRITON:
    _LIB.impl("hc_sinkhorn", hc_sinkhorn, "CUDA")
