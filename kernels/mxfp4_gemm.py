"""``y = x W^T`` with an MXFP4 weight (packed e2m1 pairs, one e8m0 scale per 32 inputs): the routed experts.

Contract (``mxfp4_gemm`` and ``mxfp4_gemm_ref`` share it):

* ``x [M, K]`` fp32 or bf16 (contiguous inner dim); ``weight [N, K/2]`` ``uint8`` (byte ``j`` holds
  input ``2j`` in its low nibble, ``2j+1`` in its high one); ``scale [N, K/32]`` e8m0
  (``float8_e8m0fnu`` or ``uint8`` bits). ``K`` is a multiple of 32.
* Returns ``[M, N]`` in ``x.dtype``, accumulated in fp32. The weight is never dequantized as a whole:
  the reference decodes 128 rows at a time; the Triton kernel decodes each loaded byte tile in
  registers (Hopper has no FP4 tensor cores, so the codes are widened before the dot).

The kernel splits a byte tile into its low and high nibbles and multiplies them with the even and
odd input columns of ``x``: ``y = x[:, 0::2] W_lo^T + x[:, 1::2] W_hi^T``, which needs no
interleaving in registers. One MoE expert projection is one call; a grouped MoE calls it per
expert slice of sorted tokens.
"""

from __future__ import annotations

import torch

from ._common import HAS_TRITON, require_triton, triton, tl
from .quant_formats import check_gemm_operands, check_mxfp4_weight, dequantize_mxfp4_rows, gemm_by_row_tiles, \
    launch_weight_gemm

if HAS_TRITON:
    from ._common import mma
    from .quant_formats import e2m1_decode, e8m0_decode

__all__ = ["mxfp4_gemm", "mxfp4_gemm_ref"]


def _check(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> None:
    check_gemm_operands("mxfp4_gemm", x, weight, scale, check_mxfp4_weight, 2, "the packed weight")


def mxfp4_gemm_ref(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Torch reference: decode 128 weight rows at a time and multiply (fp32 accumulate)."""
    _check(x, weight, scale)
    return gemm_by_row_tiles(x, weight.shape[0], lambda lo, hi: dequantize_mxfp4_rows(weight, scale, lo, hi))


if HAS_TRITON:

    @triton.jit
    def _mxfp4_gemm_kernel(x_ptr, w_ptr, s_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_sn, stride_ym,
                           BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, FP32: tl.constexpr,
                           NATIVE: tl.constexpr):
        pid_m, pid_n = tl.program_id(0), tl.program_id(1)
        rm = pid_m * BM + tl.arange(0, BM)
        rn = pid_n * BN + tl.arange(0, BN)
        rj = tl.arange(0, BK // 2)  # byte column inside the tile
        m_ok, n_ok = rm[:, None] < M, rn[:, None] < N
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k0 in range(0, K, BK):
            j = k0 // 2 + rj
            j_ok = j[None, :] < K // 2
            b = tl.load(w_ptr + rn[:, None] * stride_wn + j[None, :], mask=n_ok & j_ok, other=0).to(tl.int32)
            s = e8m0_decode(tl.load(s_ptr + rn[:, None] * stride_sn + (2 * j[None, :]) // 32, mask=n_ok & j_ok,
                                    other=127))
            w_lo = e2m1_decode(b & 15) * s
            w_hi = e2m1_decode(b >> 4) * s
            x_even = tl.load(x_ptr + rm[:, None] * stride_xm + 2 * j[None, :], mask=m_ok & j_ok, other=0.0)
            x_odd = tl.load(x_ptr + rm[:, None] * stride_xm + 2 * j[None, :] + 1, mask=m_ok & j_ok, other=0.0)
            if FP32:
                acc += mma(x_even.to(tl.float32), tl.trans(w_lo), False, NATIVE)
                acc += mma(x_odd.to(tl.float32), tl.trans(w_hi), False, NATIVE)
            else:  # e2m1 codes times a power of two are exact in bf16
                acc += mma(x_even, tl.trans(w_lo), True, NATIVE)
                acc += mma(x_odd, tl.trans(w_hi), True, NATIVE)
        tl.store(y_ptr + rm[:, None] * stride_ym + rn[None, :], acc.to(y_ptr.dtype.element_ty),
                 mask=(rm[:, None] < M) & (rn[None, :] < N))


def mxfp4_gemm(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Triton MXFP4 GEMM decoding in the kernel (same contract as :func:`mxfp4_gemm_ref`)."""
    require_triton("mxfp4_gemm")
    _check(x, weight, scale)
    return launch_weight_gemm(_mxfp4_gemm_kernel, x, weight, scale)
