"""W8A8: ``y = x W^T`` with FP8 activations and an FP8 weight, both block-scaled, on FP8 tensor cores.

Contract (``w8a8_block_gemm`` and ``w8a8_block_gemm_ref`` share it):

* ``xq [M, K]`` ``float8_e4m3fn`` and ``xs [M, K / AB]`` fp32: activations quantized in blocks of ``AB``
  consecutive inputs per row (``AB`` = ``K / xs.shape[1]``, a power of two in 16..128: 128 in the release, less
  only for narrow test models), as :func:`atom.kernels.act_quant.fp8_act_quant` makes them;
* ``weight [N, K]`` ``float8_e4m3fn`` with e8m0 ``scale [ceil(N/128), ceil(K/128)]`` (the release's linears,
  :mod:`atom.kernels.fp8_gemm`); ``out_dtype`` fp32 or bf16 -> ``[M, N]`` in ``out_dtype``.

The reference dequantizes the activations (``xq * xs``: the values ``fp8_roundtrip`` gives, exactly) and runs
:func:`atom.kernels.fp8_gemm.fp8_block_gemm_ref` on them in fp32: the arithmetic of a quantized ``Linear`` with the
release numerics on, bit for bit. The Triton kernel multiplies the FP8 tiles themselves: per K step one
``tl.dot`` of ``[BM, BK]`` x ``[BK, BN]`` e4m3 tiles into fp32, times ``xs[m, block] * w_scale[block]`` (a
product of powers of two, exact), added to an fp32 accumulator. Every product of two e4m3 values is exact in fp32
and every scale is a power of two, so the kernel and the reference add the same exact terms and differ only in
the order of the fp32 additions: each is within ``(K - 1) * 2^-24 * sum_k |x_k w_k|`` of the exact sum, so they
differ by at most twice that (plus one rounding to ``out_dtype``). The tests bound it so. On a GPU the partial
dot of one K step is accumulated by the tensor cores (Hopper's FP8 MMA keeps fewer than 24 bits there), and the
fp32 accumulator takes it every ``BK`` <= 128 inputs.

Targets: sm90 and gfx950 multiply ``e4m3fn`` natively; gfx942 (MI300) multiplies ``e4m3fnuz``, whose bytes mean
half the value (exponent bias 8) and where ``0x80`` is NaN: the kernel rewrites ``0x80`` (``-0``) to ``0`` in
registers, multiplies the bytes as fnuz and scales the tile's product by 4. Which one a launch compiles follows
the device (:func:`atom.kernels.tiles.fp8_fnuz`). In the interpreter the e4m3 tiles are decoded to fp32 and
multiplied there (its fp8 ``tl.dot`` is not the hardware's); the products are the same exact values.
"""

from __future__ import annotations

import torch

from ._common import HAS_TRITON, check_rows, check_same_device, require_triton, triton, tl
from .act_quant import MIN_ACT_BLOCK, dequantize_act
from .quant_formats import FP8_BLOCK, check_fp8_weight, dequantize_fp8_rows, gemm_by_row_tiles, gemm_tiles
from .store_rounding import rounded_for
from .tiles import fp8_fnuz, tiles_for

if HAS_TRITON:
    from .quant_formats import e8m0_decode

__all__ = ["w8a8_block_gemm", "w8a8_block_gemm_ref", "OUT_DTYPES"]

OUT_DTYPES = (torch.float32, torch.bfloat16)


def _check(xq: torch.Tensor, xs: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
           out_dtype: torch.dtype) -> int:
    """The operands' checks (module docstring); returns the activation block ``AB``."""
    check_rows("xq", xq, dtype=torch.float8_e4m3fn)
    check_fp8_weight("w8a8_block_gemm", weight, scale)
    m, k = xq.shape
    if weight.shape[1] != k:
        raise ValueError(f"xq has {k} features, the weight {weight.shape[1]}")
    check_rows("xs", xs, dtype=torch.float32)
    if xs.shape[0] != m or xs.shape[1] < 1 or k % xs.shape[1]:
        raise ValueError(f"xs must be fp32 [M={m}, K / block] activation scales with the block dividing K={k}, got "
                         f"{getattr(xs, 'dtype', type(xs).__name__)} {tuple(getattr(xs, 'shape', ()))}")
    block = k // xs.shape[1]
    if block < MIN_ACT_BLOCK or block > FP8_BLOCK or block & (block - 1):
        raise ValueError(f"the activation block K / xs.shape[1] = {block} must be a power of two in "
                         f"{MIN_ACT_BLOCK}..{FP8_BLOCK}")
    if out_dtype not in OUT_DTYPES:
        raise ValueError(f"out_dtype must be one of {', '.join(map(str, OUT_DTYPES))}, got {out_dtype}")
    check_same_device(xq=xq, xs=xs, weight=weight, scale=scale)
    return block


def w8a8_block_gemm_ref(xq: torch.Tensor, xs: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                        out_dtype: torch.dtype) -> torch.Tensor:
    """Torch reference: the dequantized activations through the weight-only reference GEMM (module docstring)."""
    _check(xq, xs, weight, scale, out_dtype)
    x = dequantize_act(xq, xs)
    return gemm_by_row_tiles(x, weight.shape[0], lambda lo, hi: dequantize_fp8_rows(weight, scale, lo, hi)
                             ).to(out_dtype)


if HAS_TRITON:

    @triton.jit
    def _fp8_dot(a, b, NATIVE: tl.constexpr, FNUZ: tl.constexpr):
        """fp32 ``a @ b`` of e4m3fn bit tiles (uint8): on the FP8 tensor cores (``NATIVE``; as fnuz on gfx942:
        ``0x80`` -> 0, product x 4), else as the decoded fp32 values (the interpreter)."""
        if NATIVE:
            if FNUZ:
                a = tl.where(a == 0x80, 0, a).to(tl.float8e4b8, bitcast=True)
                b = tl.where(b == 0x80, 0, b).to(tl.float8e4b8, bitcast=True)
                return tl.dot(a, b) * 4.0
            return tl.dot(a.to(tl.float8e4nv, bitcast=True), b.to(tl.float8e4nv, bitcast=True))
        a32 = a.to(tl.float8e4nv, bitcast=True).to(tl.float32)
        b32 = b.to(tl.float8e4nv, bitcast=True).to(tl.float32)
        return tl.dot(a32, b32, input_precision="ieee")

    @triton.jit
    def _w8a8_kernel(a_ptr, as_ptr, w_ptr, ws_ptr, y_ptr, M, N, K, stride_am, stride_asm, stride_wn, stride_wsn,
                     stride_ym, AB: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                     NATIVE: tl.constexpr, FNUZ: tl.constexpr, SWAP: tl.constexpr):
        pid_m, pid_n = tl.program_id(0), tl.program_id(1)
        rm = pid_m * BM + tl.arange(0, BM)
        rn = pid_n * BN + tl.arange(0, BN)
        rk = tl.arange(0, BK)
        ws_row = ws_ptr + ((pid_n * BN) // 128) * stride_wsn
        if SWAP:  # y^T: the weight rows fill the MMA's M side (sm90's FP8 wgmma needs 64 rows; decode has <= 16)
            acc = tl.zeros((BN, BM), dtype=tl.float32)
        else:
            acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k0 in range(0, K, BK):
            kk = k0 + rk
            a = tl.load(a_ptr + rm[:, None] * stride_am + kk[None, :], mask=(rm[:, None] < M) & (kk[None, :] < K),
                        other=0)
            w = tl.load(w_ptr + rn[:, None] * stride_wn + kk[None, :], mask=(rn[:, None] < N) & (kk[None, :] < K),
                        other=0)
            sa = tl.load(as_ptr + rm * stride_asm + k0 // AB, mask=rm < M, other=0.0)
            sw = e8m0_decode(tl.load(ws_row + k0 // 128))
            if SWAP:
                acc += _fp8_dot(w, tl.trans(a), NATIVE, FNUZ) * (sa * sw)[None, :]
            else:
                acc += _fp8_dot(a, tl.trans(w), NATIVE, FNUZ) * (sa * sw)[:, None]
        if SWAP:
            tl.store(y_ptr + rm[None, :] * stride_ym + rn[:, None], rounded_for(acc, y_ptr.dtype.element_ty),
                     mask=(rm[None, :] < M) & (rn[:, None] < N))
        else:
            tl.store(y_ptr + rm[:, None] * stride_ym + rn[None, :], rounded_for(acc, y_ptr.dtype.element_ty),
                     mask=(rm[:, None] < M) & (rn[None, :] < N))


def w8a8_block_gemm(xq: torch.Tensor, xs: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                    out_dtype: torch.dtype) -> torch.Tensor:
    """Triton W8A8 block-scaled GEMM (same contract as :func:`w8a8_block_gemm_ref`)."""
    require_triton("w8a8_block_gemm")
    block = _check(xq, xs, weight, scale, out_dtype)
    m, k = xq.shape
    n = weight.shape[0]
    y = torch.empty(m, n, dtype=out_dtype, device=xq.device)
    if m == 0:
        return y
    bm, bn, bk = gemm_tiles(m, xq.device)
    bk = min(bk, block)  # one activation scale per row and K step
    assert FP8_BLOCK % bn == 0 and FP8_BLOCK % bk == 0
    w = weight.contiguous().view(torch.uint8)
    s = scale.contiguous().view(torch.uint8)
    a = xq.view(torch.uint8)
    grid = (triton.cdiv(m, bm), triton.cdiv(n, bn))
    _w8a8_kernel[grid](a, xs, w, s, y, m, n, k, a.stride(0), xs.stride(0), w.stride(0), s.stride(0), y.stride(0),
                       AB=block, BM=bm, BN=bn, BK=bk, NATIVE=tiles_for(xq.device).native_bf16_dot,
                       FNUZ=fp8_fnuz(xq.device), SWAP=bm < 64)
    return y
