"""``y = x W^T`` with an FP8 e4m3 weight in 128 x 128 blocks, each with one e8m0 scale (the release's linears).

Contract (``fp8_block_gemm`` and ``fp8_block_gemm_ref`` share it):

* ``x [M, K]`` fp32 or bf16 (contiguous inner dim); ``weight [N, K]`` ``float8_e4m3fn``;
  ``scale [ceil(N/128), ceil(K/128)]`` e8m0 (``float8_e8m0fnu`` or its ``uint8`` bits).
* Returns ``[M, N]`` in ``x.dtype``, accumulated in fp32. The weight is never dequantized as a whole:
  the reference dequantizes one 128-row tile at a time; the Triton kernel converts each loaded
  ``[BN, BK]`` tile in registers and applies the block's scale to that tile's partial product
  (``BN``, ``BK`` divide 128, so one scale covers a tile).
* Activations are used as given; the FP8 activation quantization of the official forward is applied
  by the caller (:class:`atom.models.deepseek_v4.layers.Linear`), so this op is a pure weight op.

With fp32 ``x`` the Triton kernel multiplies in fp32 (``input_precision="ieee"``: the interpreter's
bf16 ``tl.dot`` is wrong, triton_on_cpu.md 2.3); with bf16 ``x`` the tile is converted to bf16 (e4m3
values are exact in bf16) and the tensor cores multiply bf16 into fp32.
"""

from __future__ import annotations

import torch

from ._common import HAS_TRITON, require_triton, triton, tl
from .quant_formats import check_fp8_weight, check_gemm_operands, dequantize_fp8_rows, gemm_by_row_tiles, \
    launch_weight_gemm

if HAS_TRITON:
    from ._common import mma
    from .quant_formats import e8m0_decode

__all__ = ["fp8_block_gemm", "fp8_block_gemm_ref"]


def _check(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> None:
    check_gemm_operands("fp8_block_gemm", x, weight, scale, check_fp8_weight, 1)


def fp8_block_gemm_ref(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Torch reference: dequantize 128 weight rows at a time and multiply (fp32 accumulate)."""
    _check(x, weight, scale)
    return gemm_by_row_tiles(x, weight.shape[0], lambda lo, hi: dequantize_fp8_rows(weight, scale, lo, hi))


if HAS_TRITON:

    @triton.jit
    def _fp8_block_gemm_kernel(x_ptr, w_ptr, s_ptr, y_ptr, M, N, K, stride_xm, stride_wn, stride_sn, stride_ym,
                               BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, FP32: tl.constexpr,
                               NATIVE: tl.constexpr):
        pid_m, pid_n = tl.program_id(0), tl.program_id(1)
        rm = pid_m * BM + tl.arange(0, BM)
        rn = pid_n * BN + tl.arange(0, BN)
        rk = tl.arange(0, BK)
        s_row = s_ptr + ((pid_n * BN) // 128) * stride_sn
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k0 in range(0, K, BK):
            kk = k0 + rk
            x = tl.load(x_ptr + rm[:, None] * stride_xm + kk[None, :], mask=(rm[:, None] < M) & (kk[None, :] < K),
                        other=0.0)
            w = tl.load(w_ptr + rn[:, None] * stride_wn + kk[None, :], mask=(rn[:, None] < N) & (kk[None, :] < K),
                        other=0.0)
            s = e8m0_decode(tl.load(s_row + k0 // 128))
            if FP32:
                part = mma(x.to(tl.float32), tl.trans(w.to(tl.float32)), False, NATIVE)
            else:
                part = mma(x, tl.trans(w), True, NATIVE)
            acc += part * s
        tl.store(y_ptr + rm[:, None] * stride_ym + rn[None, :], acc.to(y_ptr.dtype.element_ty),
                 mask=(rm[:, None] < M) & (rn[None, :] < N))


def fp8_block_gemm(x: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Triton block-scaled FP8 GEMM (same contract as :func:`fp8_block_gemm_ref`)."""
    require_triton("fp8_block_gemm")
    _check(x, weight, scale)
    return launch_weight_gemm(_fp8_block_gemm_kernel, x, weight, scale)
