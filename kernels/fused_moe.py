"""The routed experts of one MoE layer as two grouped GEMMs over the (token, expert) pairs.

Contract (``fused_moe`` and ``fused_moe_ref`` share it)::

    fused_moe(x, route_w, route_idx, w1, w3, w2, s1=None, s3=None, s2=None, *,
              limit, act_blocks=(0, 0), first_expert=0, h_quant=None, shared=None) -> fp32 [T, D]

* ``x [T, D]`` fp32 / bf16 (float64: reference only); ``route_w [T, k]`` fp32 routing weights and
  ``route_idx [T, k]`` int32 / int64 expert ids (the ``Gate``'s top-k or hash picks).
* The ``E`` experts held here, stacked: ``w1`` / ``w3 [E, I, D]`` and ``w2 [E, D, I]`` in one format:
  dense (``x.dtype``, no scales), FP8 (``float8_e4m3fn`` with e8m0 scales ``[E, ceil(N/128),
  ceil(K/128)]``) or MXFP4 (packed ``uint8 [E, N, K/2]`` with e8m0 scales ``[E, N, K/32]``).
  Expert ``first_expert + e`` is stacked at ``e``; pairs routed to other experts (another rank's) add
  nothing.
* Per pair, as :class:`atom.models.deepseek_v4.moe.Expert` computes it: ``gate = x W1^T``, ``up = x W3^T``
  (each rounded to ``x.dtype``), ``up`` clamped to ``[-limit, limit]`` and ``gate`` to ``<= limit``
  (``limit > 0``), ``h = route_w * silu(gate) * up`` rounded to ``x.dtype``, ``y = h W2^T`` rounded to
  ``x.dtype``. With ``act_blocks = (a, b)`` nonzero (the release numerics) the GEMM inputs first take the FP8
  round trip of :func:`atom.kernels.quant_formats.fp8_roundtrip`, ``x`` in blocks of ``a`` and ``h`` in
  blocks of ``b`` (each 0, off, or a divisor of 128 and of its width).
  The routing weight multiplies ``h`` before that round trip, as the reference does, so it is applied in
  the first GEMM's epilogue, not the second's.
* ``h_quant`` (``act_blocks[1]`` then 0) replaces the FP8 round trip of ``h``: it is called once on the
  ``[T*k, I]`` activations of the pairs in sorted order (rows of pairs not held here unspecified; every rank
  of a group sorts the same pairs the same way) and returns them rounded, same shape and dtype. A
  tensor-parallel rank whose ``w2`` input blocks span ranks passes its ``SplitInputLinear.quantize_input``
  (one all-gather of the rows' block maxima), so the rounding is the unsplit layer's, with no host read.
* Returns each token's sum of its pairs' ``y`` in fp32; with ``shared`` (``[T, D]`` fp32 / bf16 / fp16: the
  shared expert's output), that sum plus ``shared`` in fp32. On the Triton path the second GEMM's atomics add onto
  ``shared`` (the output starts as it), so the layer's ``routed + shared`` costs no launch of its own; the
  reference adds ``shared`` after the routed sum, as :meth:`MoEWeights.with_shared` does, so its result is the
  reference layer's bit for bit (the Triton path's order of adds differs, as it does among a token's pairs).

Permutation (both implementations, on the device, nothing read back): the ``T*k`` pairs are sorted by
expert (``order``), and ``offsets[E + 1]`` bound each expert's run. The reference sorts (``torch.sort``,
stable, then ``searchsorted`` of the sorted ids); the Triton path runs one launch of
:func:`~atom.kernels.moe_permute.moe_permute` (a counting sort giving the same order and offsets), which also
zeroes the output the second GEMM accumulates into (or copies ``shared`` into it).

Triton: one launch for ``w1`` / ``w3`` (two accumulators, SwiGLU, clamp, routing weight and the FP8
round trip of ``h`` in the epilogue; ``h`` goes to a ``[T*k, I]`` buffer in sorted order) and one for ``w2``
(the combine fused: each pair's row is atomically added to its token's fp32 output row, so the order of a
token's ``k`` adds is not fixed on a GPU). A program takes ``BM`` pairs of one expert: it finds its expert
and tile from ``offsets`` (a cumulative sum of the experts' tile counts in registers); the grid is sized
from shapes only (``cdiv(T*k, BM) + min(E, T*k)`` row tiles bound the tile count), so it is fixed inside a
captured graph and surplus programs exit at once. FP8 and MXFP4 tiles are decoded in registers (e4m3 /
e2m1 codes times a power of two are exact in bf16) and multiplied on bf16 tensor cores (``_common.mma``);
with fp32 ``x`` the dots are fp32 IEEE (the CPU verification path).

Torch reference: the same permutation, then ``torch._grouped_mm`` over the sorted pairs (only routed pairs
are computed; weights are never gathered per row; no host read). Quantized experts are decoded in fp32 and
multiplied in fp32, as the single-weight GEMM references do. ``_grouped_mm`` takes fp32 / bf16 only and
16-byte aligned strides, so float64 (the CPU verification mode) and unaligned widths run one GEMM per
expert over the same sorted runs, which reads ``offsets`` back (E + 1 integers). The combine sums each
token's pairs in ascending expert order, as :meth:`MoEWeights.routed` does.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from ._common import HAS_TRITON, VALUE_DTYPES, check_rows, check_same_device, next_pow2, require_triton, \
    triton, tl, value_checks_enabled
from .quant_formats import FP4_GROUP, FP8_BLOCK, e8m0_to_float, fp8_roundtrip, unpack_fp4
from .moe_permute import moe_permute
from .tiles import tiles_for

if HAS_TRITON:
    from ._common import mma
    from .quant_formats import e2m1_decode, e4m3_bits, e8m0_decode, ue8m0_exponent

__all__ = ["fused_moe", "fused_moe_ref", "expert_format", "reference_reads_offsets"]

_FMT_CODE = {"dense": 0, "fp8": 1, "mxfp4": 2}
#: dtypes of ``shared`` (float64: the reference only, like ``x``)
_SHARED_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def expert_format(weight: torch.Tensor) -> str:
    """``dense``, ``fp8`` or ``mxfp4`` from a stacked expert weight's dtype."""
    if weight.dtype == torch.float8_e4m3fn:
        return "fp8"
    return "mxfp4" if weight.dtype == torch.uint8 else "dense"


def _check_weight(name: str, w: torch.Tensor, s: torch.Tensor | None, fmt: str, e: int, n: int, k: int,
                  dtype: torch.dtype) -> None:
    cols = k // 2 if fmt == "mxfp4" else k
    if tuple(w.shape) != (e, n, cols) or expert_format(w) != fmt:
        raise ValueError(f"fused_moe: {name} must be {fmt} of shape {(e, n, cols)}, got {w.dtype} "
                         f"{tuple(w.shape)}")
    if fmt == "dense":
        if w.dtype != dtype or s is not None:
            raise ValueError(f"fused_moe: dense {name} must be {dtype} like x and take no scale, got {w.dtype}")
        return
    if fmt == "mxfp4" and k % FP4_GROUP:
        raise ValueError(f"fused_moe: MXFP4 {name} needs inputs divisible by {FP4_GROUP}, got {k}")
    want = (e, -(-n // FP8_BLOCK), -(-k // FP8_BLOCK)) if fmt == "fp8" else (e, n, k // FP4_GROUP)
    if s is None or s.dtype not in (torch.float8_e8m0fnu, torch.uint8) or tuple(s.shape) != want:
        got = None if s is None else (s.dtype, tuple(s.shape))
        raise ValueError(f"fused_moe: {name} needs e8m0 scales (float8_e8m0fnu or uint8) of shape {want}, "
                         f"got {got}")


def _check(x, route_w, route_idx, w1, w3, w2, s1, s3, s2, limit: float, act_blocks: tuple[int, int],
           first_expert: int, h_quant: Callable[[torch.Tensor], torch.Tensor] | None = None,
           shared: torch.Tensor | None = None) -> str:
    """The experts' format after ``ValueError`` checks of every argument (values only with value checks on)."""
    check_rows("x", x, dtypes=VALUE_DTYPES)
    t, d = x.shape
    if route_idx.dim() != 2 or route_idx.shape[0] != t or route_idx.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"fused_moe: route_idx must be int32/int64 [T={t}, k], got {route_idx.dtype} "
                         f"{tuple(route_idx.shape)}")
    if route_w.dtype != torch.float32 or route_w.shape != route_idx.shape:
        raise ValueError(f"fused_moe: route_w must be fp32 of route_idx's shape {tuple(route_idx.shape)}, got "
                         f"{route_w.dtype} {tuple(route_w.shape)}")
    if w1.dim() != 3:
        raise ValueError(f"fused_moe: w1 must be stacked [E, I, D], got {tuple(w1.shape)}")
    fmt, e, i = expert_format(w1), w1.shape[0], w1.shape[1]
    _check_weight("w1", w1, s1, fmt, e, i, d, x.dtype)
    _check_weight("w3", w3, s3, fmt, e, i, d, x.dtype)
    _check_weight("w2", w2, s2, fmt, e, d, i, x.dtype)
    if len(act_blocks) != 2 or any(b < 0 or (b and (128 % b or width % b)) for b, width in zip(act_blocks, (d, i))):
        raise ValueError(f"fused_moe: act_blocks must be two blocks (x's, h's), each 0 or dividing 128 and its "
                         f"width (D={d}, I={i}), got {act_blocks}")
    if h_quant is not None and act_blocks[1]:
        raise ValueError(f"fused_moe: h_quant replaces the round trip of h; act_blocks[1] must then be 0, got "
                         f"{act_blocks[1]}")
    if first_expert < 0 or limit < 0:
        raise ValueError(f"fused_moe: first_expert and limit must be >= 0, got {first_expert}, {limit}")
    if shared is not None and (shared.shape != x.shape or shared.dtype not in _SHARED_DTYPES):
        raise ValueError(f"fused_moe: shared (the shared expert's output) must be x's shape {tuple(x.shape)} in "
                         f"{', '.join(map(str, _SHARED_DTYPES))}, got {shared.dtype} {tuple(shared.shape)}")
    check_same_device(x=x, route_w=route_w, route_idx=route_idx, w1=w1, w3=w3, w2=w2,
                      **({} if shared is None else {"shared": shared}))
    if value_checks_enabled() and route_idx.numel() and int(route_idx.min()) < 0:
        raise ValueError("fused_moe: route_idx holds a negative expert id")
    return fmt


def _permute(route_idx: torch.Tensor, num_experts: int, first_expert: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(order [T*k] int64, offsets [E+1])``: pairs sorted by expert (pairs of experts not held here last),
    ``offsets[e] .. offsets[e+1]`` the run of stacked expert ``e``; ``offsets[0] == 0``."""
    t, k = route_idx.shape
    key = route_idx.new_empty(t * k)
    key.view(t, k).copy_(route_idx)  # one copy whatever the strides (a column slice of the gate's sort is
    # viewable as flat only at one token), so the ops do not depend on the batch
    if first_expert:
        key = key - first_expert
        key = key.masked_fill(key < 0, num_experts)  # another rank's expert: after every held one
    sorted_key, order = torch.sort(key, stable=True)
    bounds = torch.arange(num_experts + 1, dtype=sorted_key.dtype, device=key.device)
    return order, torch.searchsorted(sorted_key, bounds)


# ----- torch reference -------------------------------------------------------------------------------------------

def _dequantize(w: torch.Tensor, s: torch.Tensor, fmt: str) -> torch.Tensor:
    """fp32 ``[E, N, K]`` of stacked FP8 / MXFP4 expert weights."""
    scale = e8m0_to_float(s)
    if fmt == "fp8":
        n, k = w.shape[1], w.shape[2]
        scale = scale.repeat_interleave(FP8_BLOCK, 1)[:, :n].repeat_interleave(FP8_BLOCK, 2)[:, :, :k]
        return w.float() * scale
    return unpack_fp4(w) * scale.repeat_interleave(FP4_GROUP, 2)


def reference_reads_offsets(dtype: torch.dtype, dim: int, inter: int) -> bool:
    """Whether :func:`fused_moe_ref` reads ``offsets`` back for activations of ``dtype`` and widths ``D``, ``I``
    (float64, or rows whose byte width ``torch._grouped_mm`` cannot take)."""
    size = torch.empty((), dtype=dtype).element_size()
    return dtype not in (torch.float32, torch.bfloat16) or any(w * size % 16 or w * 4 % 16 for w in (dim, inter))


def _grouped_gemm(a: torch.Tensor, w: torch.Tensor, s: torch.Tensor | None, fmt: str,
                  offsets: torch.Tensor) -> torch.Tensor:
    """Rows ``offsets[e] .. offsets[e+1]`` of ``a [P, K]`` times expert ``e``'s ``W^T``, in ``a.dtype``
    (rows past ``offsets[E]`` are left unspecified)."""
    wf = w if fmt == "dense" else _dequantize(w, s, fmt)
    af = a if fmt == "dense" else a.float()
    if not reference_reads_offsets(af.dtype, af.shape[1], wf.shape[1]):
        out = torch._grouped_mm(af, wf.transpose(1, 2), offs=offsets[1:].to(torch.int32))
        return out.to(a.dtype)
    out = torch.zeros(a.shape[0], w.shape[1], dtype=a.dtype, device=a.device)
    bounds = offsets.tolist()  # float64 / unaligned widths only: the loop needs each run's length
    for e in range(w.shape[0]):
        lo, hi = bounds[e], bounds[e + 1]
        if hi > lo:
            out[lo:hi] = F.linear(af[lo:hi], wf[e]).to(a.dtype)
    return out


def _rounded_h(h_quant: Callable[[torch.Tensor], torch.Tensor], h: torch.Tensor) -> torch.Tensor:
    """``h_quant(h)`` after checking it kept ``h``'s shape and dtype."""
    out = h_quant(h)
    if out.shape != h.shape or out.dtype != h.dtype:
        raise ValueError(f"fused_moe: h_quant must return h's shape {tuple(h.shape)} and dtype {h.dtype}, got "
                         f"{tuple(out.shape)} {out.dtype}")
    return out


def fused_moe_ref(x: torch.Tensor, route_w: torch.Tensor, route_idx: torch.Tensor, w1: torch.Tensor,
                  w3: torch.Tensor, w2: torch.Tensor, s1: torch.Tensor | None = None, s3: torch.Tensor | None = None,
                  s2: torch.Tensor | None = None, *, limit: float, act_blocks: tuple[int, int] = (0, 0),
                  first_expert: int = 0, h_quant: Callable[[torch.Tensor], torch.Tensor] | None = None,
                  shared: torch.Tensor | None = None) -> torch.Tensor:
    """Torch reference (module docstring): grouped GEMMs over the expert-sorted pairs, no host read."""
    fmt = _check(x, route_w, route_idx, w1, w3, w2, s1, s3, s2, limit, act_blocks, first_expert, h_quant, shared)
    t, k = route_idx.shape
    order, offsets = _permute(route_idx, w1.shape[0], first_expert)
    xq = fp8_roundtrip(x, act_blocks[0]) if act_blocks[0] else x
    rows = xq[order // k]
    gate = _grouped_gemm(rows, w1, s1, fmt, offsets).float()
    up = _grouped_gemm(rows, w3, s3, fmt, offsets).float()
    if limit > 0:
        up = up.clamp(-limit, limit)
        gate = gate.clamp(max=limit)
    h = (route_w.reshape(-1)[order][:, None] * (F.silu(gate) * up)).to(x.dtype)
    if act_blocks[1]:
        h = fp8_roundtrip(h, act_blocks[1])
    elif h_quant is not None:
        h = _rounded_h(h_quant, h)
    held = torch.arange(order.shape[0], device=x.device) < offsets[-1]  # pairs of experts held here
    y = torch.where(held[:, None], _grouped_gemm(h, w2, s2, fmt, offsets).float(), 0.0)
    pair_out = torch.empty_like(y)
    pair_out[order] = y
    ascending = torch.sort(route_idx, dim=1, stable=True).indices
    per_slot = pair_out.view(t, k, y.shape[1]).gather(1, ascending[:, :, None].expand(-1, -1, y.shape[1]))
    routed = per_slot.sum(dim=1)
    return routed if shared is None else routed + shared.float()


# ----- Triton ----------------------------------------------------------------------------------------------------

if HAS_TRITON:

    @triton.jit
    def _find_tile(off_ptr, E, pid, BM: tl.constexpr, E_PAD: tl.constexpr):
        """``(expert, first row, end row)`` of row tile ``pid``; expert ``>= E`` when ``pid`` is past the last."""
        e = tl.arange(0, E_PAD)
        lo = tl.load(off_ptr + e, mask=e < E, other=0)
        hi = tl.load(off_ptr + e + 1, mask=e < E, other=0)
        tiles = (hi - lo + BM - 1) // BM
        end = tl.cumsum(tiles, 0)
        ex = tl.sum((end <= pid).to(tl.int32), 0)
        sel = e == ex
        start = tl.sum(tl.where(sel, lo + (pid - (end - tiles)) * BM, 0), 0)
        stop = tl.sum(tl.where(sel, hi, 0), 0)
        return ex, start, stop

    @triton.jit
    def _round_to(v, dt: tl.constexpr):
        """fp32 ``v`` rounded to ``dt`` (fp32 or bf16) and back: bf16 by round-to-nearest-even on the bits (the
        interpreter's cast truncates; a GPU's cast rounds the same way), so the stores that follow are exact."""
        if dt == tl.bfloat16:
            u = v.to(tl.uint32, bitcast=True)
            u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
            v = u.to(tl.float32, bitcast=True)
        return v

    @triton.jit
    def _fp8_round_trip(v, BM: tl.constexpr, BK: tl.constexpr, AB: tl.constexpr):
        """fp32 ``v [BM, BK]`` through e4m3 with one power-of-two scale per ``AB`` columns (software encode:
        the interpreter's fp8 cast is wrong), as ``fp8_roundtrip``."""
        vb = tl.reshape(v, (BM, BK // AB, AB))
        e = ue8m0_exponent(tl.max(tl.abs(vb), 2))
        scale = ((e + 127) << 23).to(tl.float32, bitcast=True)[:, :, None]
        q = e4m3_bits(vb / scale).to(tl.float8e4nv, bitcast=True).to(tl.float32)
        return tl.reshape(q * scale, (BM, BK))

    @triton.jit
    def _weight_tile(w_ptr, s_ptr, ex, rn, k0, N, K, stride_we, stride_wn, stride_se, stride_sn,
                     FMT: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
        """Expert ``ex``'s weight rows ``rn`` x inputs ``k0 .. k0 + BK`` (``[BN, BK]``), decoded and scaled
        (fp32), or the dense tile as stored."""
        kk = k0 + tl.arange(0, BK)
        w_base = w_ptr + ex.to(tl.int64) * stride_we
        n_ok = rn[:, None] < N
        if FMT == 0:
            w = tl.load(w_base + rn[:, None] * stride_wn + kk[None, :], mask=n_ok & (kk[None, :] < K), other=0.0)
        elif FMT == 1:
            w = tl.load(w_base + rn[:, None] * stride_wn + kk[None, :], mask=n_ok & (kk[None, :] < K), other=0.0)
            s_base = s_ptr + ex.to(tl.int64) * stride_se
            s = e8m0_decode(tl.load(s_base + (rn[:, None] // 128) * stride_sn + kk[None, :] // 128,
                                    mask=n_ok & (kk[None, :] < K), other=127))
            w = w.to(tl.float32) * s
        else:
            j = k0 // 2 + tl.arange(0, BK // 2)  # the tile's packed byte columns
            j_ok = n_ok & (j[None, :] < K // 2)
            b = tl.load(w_base + rn[:, None] * stride_wn + j[None, :], mask=j_ok, other=0).to(tl.int32)
            s_base = s_ptr + ex.to(tl.int64) * stride_se
            s = e8m0_decode(tl.load(s_base + rn[:, None] * stride_sn + (2 * j[None, :]) // 32, mask=j_ok,
                                    other=127))
            w = tl.reshape(tl.join(e2m1_decode(b & 15) * s, e2m1_decode(b >> 4) * s), (BN, BK))
        return w

    @triton.jit
    def _moe_up_kernel(x_ptr, order_ptr, rw_ptr, off_ptr, w1_ptr, w3_ptr, s1_ptr, s3_ptr, h_ptr, E, D, I,
                       stride_xt, stride_we, stride_wn, stride_se, stride_sn, stride_hp, limit,
                       TOPK: tl.constexpr, FMT: tl.constexpr, AB: tl.constexpr, CLAMP: tl.constexpr,
                       BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, E_PAD: tl.constexpr,
                       FP32: tl.constexpr, NATIVE: tl.constexpr):
        ex, start, stop = _find_tile(off_ptr, E, tl.program_id(0), BM, E_PAD)
        if ex < E:
            r = start + tl.arange(0, BM)
            ok = r < stop
            pair = tl.load(order_ptr + r, mask=ok, other=0)
            tok = (pair // TOPK).to(tl.int64)
            rn = tl.program_id(1) * BN + tl.arange(0, BN)
            gate = tl.zeros((BM, BN), dtype=tl.float32)
            up = tl.zeros((BM, BN), dtype=tl.float32)
            for k0 in range(0, D, BK):
                kk = k0 + tl.arange(0, BK)
                a = tl.load(x_ptr + tok[:, None] * stride_xt + kk[None, :], mask=ok[:, None] & (kk[None, :] < D),
                            other=0.0).to(tl.float32)
                if AB > 0:
                    a = _fp8_round_trip(a, BM, BK, AB)
                wg = _weight_tile(w1_ptr, s1_ptr, ex, rn, k0, I, D, stride_we, stride_wn, stride_se, stride_sn,
                                  FMT, BN, BK)
                wu = _weight_tile(w3_ptr, s3_ptr, ex, rn, k0, I, D, stride_we, stride_wn, stride_se, stride_sn,
                                  FMT, BN, BK)
                gate += mma(a, tl.trans(wg.to(tl.float32)), not FP32, NATIVE)
                up += mma(a, tl.trans(wu.to(tl.float32)), not FP32, NATIVE)
            dt = h_ptr.dtype.element_ty
            gate = _round_to(gate, dt)
            up = _round_to(up, dt)
            if CLAMP:
                up = tl.minimum(tl.maximum(up, -limit), limit)
                gate = tl.minimum(gate, limit)
            rw = tl.load(rw_ptr + pair, mask=ok, other=0.0)
            h = _round_to(rw[:, None] * (gate * tl.sigmoid(gate) * up), dt)
            tl.store(h_ptr + r[:, None].to(tl.int64) * stride_hp + rn[None, :], h.to(dt),
                     mask=ok[:, None] & (rn[None, :] < I))

    @triton.jit
    def _moe_down_kernel(h_ptr, order_ptr, off_ptr, w2_ptr, s2_ptr, out_ptr, E, D, I, stride_hp, stride_we,
                         stride_wn, stride_se, stride_sn, stride_ot,
                         TOPK: tl.constexpr, FMT: tl.constexpr, AB: tl.constexpr, BM: tl.constexpr,
                         BN: tl.constexpr, BK: tl.constexpr, E_PAD: tl.constexpr, FP32: tl.constexpr,
                         NATIVE: tl.constexpr):
        ex, start, stop = _find_tile(off_ptr, E, tl.program_id(0), BM, E_PAD)
        if ex < E:
            r = start + tl.arange(0, BM)
            ok = r < stop
            tok = (tl.load(order_ptr + r, mask=ok, other=0) // TOPK).to(tl.int64)
            rn = tl.program_id(1) * BN + tl.arange(0, BN)
            acc = tl.zeros((BM, BN), dtype=tl.float32)
            for k0 in range(0, I, BK):
                kk = k0 + tl.arange(0, BK)
                a = tl.load(h_ptr + r[:, None].to(tl.int64) * stride_hp + kk[None, :],
                            mask=ok[:, None] & (kk[None, :] < I), other=0.0).to(tl.float32)
                if AB > 0:
                    a = _fp8_round_trip(a, BM, BK, AB)
                w = _weight_tile(w2_ptr, s2_ptr, ex, rn, k0, D, I, stride_we, stride_wn, stride_se, stride_sn,
                                 FMT, BN, BK)
                acc += mma(a, tl.trans(w.to(tl.float32)), not FP32, NATIVE)
            y = _round_to(acc, h_ptr.dtype.element_ty)
            tl.atomic_add(out_ptr + tok[:, None] * stride_ot + rn[None, :], y, mask=ok[:, None] & (rn[None, :] < D))


def moe_tiles(pairs: int, num_experts: int, device: torch.device) -> tuple[int, int, int]:
    """``(BM, BN, BK)``: ``BM`` the power of two covering the mean pairs per expert, between 16 (the dot's
    minimum) and ``Tiles.moe_bm``; ``BN`` / ``BK`` from the tile table (they divide 128: one FP8 scale per
    tile row and column block). Shapes only, so a captured graph keeps them."""
    t = tiles_for(device)
    bm = min(max(16, next_pow2(-(-pairs // max(num_experts, 1)))), t.moe_bm)
    return bm, t.moe_bn, t.moe_bk


def _inner_contiguous(t: torch.Tensor, twin: torch.Tensor) -> torch.Tensor:
    """``t`` as the kernel reads it: unit inner stride and the strides of ``twin`` (``w1`` / ``w3`` share
    theirs); a contiguous copy otherwise. Stacks with stride 0 over the experts (the compile report's
    launch shapes) are kept as they are."""
    return t if t.stride(-1) == 1 and t.stride() == twin.stride() else t.contiguous()


def _strides(s: torch.Tensor | None, twin: torch.Tensor | None,
             weight: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    """The scales as ``uint8`` bits with their expert and row strides; for dense experts (no scales) the
    ``weight`` itself stands in as the pointer, which the dense kernels never read through (no allocation, no
    fill launched per call)."""
    if s is None:
        return weight, 0, 0
    s8 = _inner_contiguous(s, s if twin is None else twin).view(torch.uint8)
    return s8, s8.stride(0), s8.stride(1)


def fused_moe(x: torch.Tensor, route_w: torch.Tensor, route_idx: torch.Tensor, w1: torch.Tensor,
              w3: torch.Tensor, w2: torch.Tensor, s1: torch.Tensor | None = None, s3: torch.Tensor | None = None,
              s2: torch.Tensor | None = None, *, limit: float, act_blocks: tuple[int, int] = (0, 0),
              first_expert: int = 0, h_quant: Callable[[torch.Tensor], torch.Tensor] | None = None,
              shared: torch.Tensor | None = None) -> torch.Tensor:
    """Triton fused MoE: permutation, then one launch per GEMM pair (same contract as :func:`fused_moe_ref`)."""
    require_triton("fused_moe")
    fmt = _check(x, route_w, route_idx, w1, w3, w2, s1, s3, s2, limit, act_blocks, first_expert, h_quant, shared)
    if x.dtype == torch.float64:
        raise ValueError("fused_moe: float64 runs on the torch reference only (the CPU verification mode)")
    t, k = route_idx.shape
    e, i, d = w1.shape[0], w1.shape[1], x.shape[1]
    out = torch.empty(t, d, dtype=torch.float32, device=x.device)
    pairs = t * k
    if pairs == 0:
        return out.zero_() if shared is None else out.copy_(shared)
    # one launch; it also sets out to 0, or to the shared expert's output the routed pairs are added onto
    order, offsets = moe_permute(route_idx, e, first_expert, zero=out,
                                 init=None if shared is None else shared.contiguous())
    h = torch.empty(pairs, i, dtype=x.dtype, device=x.device)
    bm, bn, bk = moe_tiles(pairs, e, x.device)
    row_tiles = triton.cdiv(pairs, bm) + min(e, pairs)
    w1c, w3c, w2c = _inner_contiguous(w1, w3), _inner_contiguous(w3, w1), _inner_contiguous(w2, w2)
    (s1c, se1, sn1), (s3c, _, _) = _strides(s1, s3, w1c), _strides(s3, s1, w3c)
    s2c, se2, sn2 = _strides(s2, s2, w2c)
    rw = route_w.contiguous()
    x = x.contiguous()
    common = dict(TOPK=k, FMT=_FMT_CODE[fmt], BM=bm, BN=bn, BK=bk, E_PAD=next_pow2(e + 1),
                  FP32=x.dtype == torch.float32, NATIVE=tiles_for(x.device).native_bf16_dot)
    _moe_up_kernel[(row_tiles, triton.cdiv(i, bn))](
        x, order, rw, offsets, w1c, w3c, s1c, s3c, h, e, d, i, x.stride(0), w1c.stride(0), w1c.stride(1),
        se1, sn1, h.stride(0), float(limit), AB=act_blocks[0], CLAMP=limit > 0, **common)
    if h_quant is not None:
        h = _rounded_h(h_quant, h).contiguous()
    _moe_down_kernel[(row_tiles, triton.cdiv(d, bn))](
        h, order, offsets, w2c, s2c, out, e, d, i, h.stride(0), w2c.stride(0), w2c.stride(1), se2, sn2,
        out.stride(0), AB=act_blocks[1], **common)
    return out
