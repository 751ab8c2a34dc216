"""Sparse attention over gathered rows with a per-head attention sink (prefill and decode shapes).

Contract. For query token ``t`` and head ``h`` the key set is the rows ``window_rows[window_idx[t, :]]``
followed by ``comp_rows[comp_idx[t, :]]``; -1 entries are masked out. Every row is both key and
value (DSV4 shares one latent row). With ``s_j = scale * <q[t, h], row_j>``::

    out[t, h] = sum_j exp(s_j) * row_j / (sum_j exp(s_j) + exp(sink[h]))

i.e. the learned sink adds ``exp(sink[h])`` to the softmax denominator only (a key whose value is
zero), so attention mass may be < 1 and a token with no valid row gets an all-zero output, never NaN.

The Triton kernel is FlashAttention-style: one program per (token, block of heads), an online
softmax over blocks of ``BLOCK_N`` indices of each source, started from the sink (running max =
sink, running sum = 1, accumulator = 0). Accumulation is fp32. With bf16 ``q`` both dots run on bf16
tensor cores (``_common.mma``): ``Q K^T`` is exact (the rows are exact in bf16), the probabilities are
rounded to bf16 for ``P V`` (error at most ``2^-8 max|row|``); in the interpreter, whose bf16 ``tl.dot``
is wrong, the same bf16 values are multiplied in an fp32 dot. With fp32 ``q`` the dots are fp32 IEEE.
Output has ``q``'s dtype.

Row formats: the window and compressed rows are plain rows of ``q``'s dtype (``codec=None``) or uint8
``fp8_ds_mla`` byte rows (``codec`` = their :class:`~atom.kernels.fp8_ds_mla.Fp8DsMlaLayout`), decoded
in registers tile by tile (:mod:`atom.kernels.kv_rows`); no dequantized copy of the window or of the
picked entries is made.
"""

from __future__ import annotations

import torch

from ._common import (HAS_TRITON, VALUE_DTYPES, check_index, check_range, check_rows, check_same_device, next_pow2,
                      require_triton, triton, tl, value_checks_enabled)
from .key_blocks import block_partial_sums, block_scores, key_blocks_on
from .step_memo import memoized
from .tiles import tiles_for
from .kv_rows import RowCodec, check_value_rows, codec_constexprs, decode_rows_ref, row_width

__all__ = ["sparse_attention", "sparse_attention_ref"]


def _check_source(q, name, rows, idx, codec: RowCodec = None) -> None:
    if codec is None:
        check_rows(f"{name}_rows", rows, dtype=q.dtype, width=q.shape[2])
    else:
        check_value_rows(f"{name}_rows", rows, "q", None, codec)
        if row_width(rows, codec) != q.shape[2]:
            raise ValueError(f"{name}_rows hold rows of {row_width(rows, codec)} values, q has {q.shape[2]} dims")
    check_index(f"{name}_idx", idx, (q.shape[0], None))
    check_range(f"{name}_idx", idx, -1, rows.shape[0], f"rows of {name}_rows, or -1 = masked")
    check_same_device(q=q, rows=rows, idx=idx)


def _check(q, window_rows, window_idx, comp_rows, comp_idx, sink, scale, codec: RowCodec = None) -> None:
    check_rows("q", q, ndim=3, dtypes=VALUE_DTYPES)
    num_tokens, heads, dim = q.shape
    _check_source(q, "window", window_rows, window_idx, codec)
    if (comp_rows is None) != (comp_idx is None):
        raise ValueError("comp_rows and comp_idx must be given together (or both None)")
    if comp_rows is not None:
        _check_source(q, "comp", comp_rows, comp_idx, codec)
    check_rows("sink", sink, ndim=1, dtype=torch.float32, width=heads)
    if value_checks_enabled() and not bool(torch.isfinite(sink).all()):
        raise ValueError("sink must be finite (it starts the online softmax; -inf would give NaN on empty rows)")
    check_same_device(q=q, window_rows=window_rows, window_idx=window_idx, sink=sink)
    if not isinstance(scale, float) or not scale > 0:
        raise ValueError(f"scale must be a positive float, got {scale!r}")


def sparse_attention_ref(q: torch.Tensor, window_rows: torch.Tensor, window_idx: torch.Tensor,
                         comp_rows: torch.Tensor | None, comp_idx: torch.Tensor | None, sink: torch.Tensor, *,
                         scale: float, codec: RowCodec = None) -> torch.Tensor:
    """Torch reference of :func:`sparse_attention` (same contract), in fp32; inside
    :func:`~atom.kernels.key_blocks.fixed_key_blocks` over fixed blocks of keys (that module's docstring)."""
    _check(q, window_rows, window_idx, comp_rows, comp_idx, sink, scale, codec)
    picks, masked = _key_index(window_idx, comp_idx)
    keys = torch.cat([_gather(rows, at, codec) for rows, at in zip((window_rows, comp_rows), picks)], dim=1)
    keys = keys.masked_fill(masked[..., None], 0.0)  # [T, K, D]; a masked slot must not read row 0 (NaN arena)
    blocked = key_blocks_on()  # each query's result independent of its list's padding and of the other queries
    logits = (block_scores(q.float(), keys) if blocked else torch.einsum("thd,tkd->thk", q.float(), keys)) * scale
    logits = logits.masked_fill(masked[:, None, :], float("-inf"))
    m = torch.maximum(logits.amax(dim=-1), sink[None, :])  # [T, H], finite because sink is
    p = torch.exp(logits - m[..., None])
    if blocked:
        total, weighted = block_partial_sums(p, keys)
    else:
        total, weighted = p.sum(dim=-1), torch.einsum("thk,tkd->thd", p, keys)
    denom = total + torch.exp(sink[None, :] - m)
    return (weighted / denom[..., None]).to(q.dtype)


@memoized
def _key_index(window_idx: torch.Tensor, comp_idx: torch.Tensor | None) -> tuple[list[torch.Tensor], torch.Tensor]:
    """(the row each slot of each source reads, -1 as row 0; ``[T, K]`` true at the masked slots of the sources
    side by side): index arithmetic only, once per step for the window lists the layers share (:mod:`.step_memo`)."""
    sources = [idx for idx in (window_idx, comp_idx) if idx is not None]
    return [idx.long().clamp(min=0) for idx in sources], torch.cat([idx < 0 for idx in sources], dim=1)


def _gather(rows: torch.Tensor, at: torch.Tensor, codec: RowCodec) -> torch.Tensor:
    """fp32 ``[T, K, D]`` values of ``rows[at]`` (``at`` from :func:`_key_index`; the caller masks -1 slots)."""
    picked = rows[at]
    if codec is None:
        return picked.float()
    return decode_rows_ref(picked.flatten(0, 1), codec).view(at.shape[0], at.shape[1], -1)


if HAS_TRITON:

    from ._common import mma
    from .kv_rows import load_rows

    @triton.jit
    def _attend_source(q, m_i, l_i, acc, rows_ptr, rows_stride, idx_ptr, start, end, dim, scale,
                       BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, FMT: tl.constexpr, NOPE: tl.constexpr,
                       ROPE: tl.constexpr, QBLOCK: tl.constexpr, BF16: tl.constexpr, NATIVE: tl.constexpr,
                       ALIGNED: tl.constexpr):
        """Fold the rows listed at idx_ptr[start:end] into the online-softmax state (m_i, l_i, acc)."""
        d = tl.arange(0, BLOCK_D)
        for n0 in range(start, end, BLOCK_N):
            n = n0 + tl.arange(0, BLOCK_N)
            idx = tl.load(idx_ptr + n, mask=n < end, other=-1)
            valid = idx >= 0
            kv = load_rows(rows_ptr, idx.to(tl.int64) * rows_stride, valid, d, dim, FMT, NOPE, ROPE, QBLOCK, ALIGNED)
            if BF16:
                kv = kv.to(tl.bfloat16)  # exact: the rows are bf16 values; halves the tile's registers
            s = mma(q, tl.trans(kv), BF16, NATIVE) * scale
            s = tl.where(valid[None, :], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, axis=1))
            alpha = tl.exp(m_i - m_new)
            p = tl.exp(s - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, axis=1)
            acc = acc * alpha[:, None] + mma(p, kv, BF16, NATIVE)
            m_i = m_new
        return m_i, l_i, acc

    @triton.jit
    def _sparse_attention_kernel(q_ptr, out_ptr, part_ptr, ml_ptr, wrows_ptr, widx_ptr, crows_ptr, cidx_ptr,
                                 sink_ptr, heads, dim, n_win, n_comp, splits, split_len, q_s0, q_s1, o_s0, o_s1,
                                 wrows_stride, crows_stride, scale, HAS_COMP: tl.constexpr, SPLIT: tl.constexpr,
                                 BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
                                 FMT: tl.constexpr, NOPE: tl.constexpr, ROPE: tl.constexpr, QBLOCK: tl.constexpr,
                                 BF16: tl.constexpr, NATIVE: tl.constexpr, ALIGNED: tl.constexpr):
        """One program per (token, head block, split of the key list); programs of one token are neighbours
        so they share its rows in L2. ``SPLIT``: write the split's unnormalised state to ``part`` / ``ml``
        for :func:`_combine_kernel`; else the output."""
        pid = tl.program_id(0)
        sp = pid % splits
        hblocks = tl.cdiv(heads, BLOCK_H)
        t = (pid // splits // hblocks).to(tl.int64)
        h = (pid // splits % hblocks) * BLOCK_H + tl.arange(0, BLOCK_H)
        d = tl.arange(0, BLOCK_D)
        hm = h < heads
        qm = hm[:, None] & (d[None, :] < dim)
        q = tl.load(q_ptr + t * q_s0 + h[:, None] * q_s1 + d[None, :], mask=qm, other=0.0)
        if not BF16:
            q = q.to(tl.float32)
        # every split starts from the sink as its running max; only split 0 counts the sink's exp(0) = 1
        m_i = tl.load(sink_ptr + h, mask=hm, other=0.0)
        l_i = tl.full([BLOCK_H], 1.0, tl.float32) * (sp == 0).to(tl.float32)
        acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
        lo = sp * split_len  # keys lo .. hi of the window list followed by the compressed list
        hi = lo + split_len
        m_i, l_i, acc = _attend_source(q, m_i, l_i, acc, wrows_ptr, wrows_stride, widx_ptr + t * n_win,
                                       tl.minimum(lo, n_win), tl.minimum(hi, n_win), dim, scale, BLOCK_N, BLOCK_D,
                                       FMT, NOPE, ROPE, QBLOCK, BF16, NATIVE, ALIGNED)
        if HAS_COMP:
            c_lo = tl.minimum(tl.maximum(lo - n_win, 0), n_comp)
            c_hi = tl.minimum(tl.maximum(hi - n_win, 0), n_comp)
            m_i, l_i, acc = _attend_source(q, m_i, l_i, acc, crows_ptr, crows_stride, cidx_ptr + t * n_comp, c_lo,
                                           c_hi, dim, scale, BLOCK_N, BLOCK_D, FMT, NOPE, ROPE, QBLOCK, BF16, NATIVE,
                                           ALIGNED)
        if SPLIT:
            base = t * splits + sp
            tl.store(part_ptr + (base * heads + h[:, None]) * dim + d[None, :], acc, mask=qm)
            tl.store(ml_ptr + (base * 2) * heads + h, m_i, mask=hm)
            tl.store(ml_ptr + (base * 2 + 1) * heads + h, l_i, mask=hm)
        else:
            out = acc / l_i[:, None]
            tl.store(out_ptr + t * o_s0 + h[:, None] * o_s1 + d[None, :], out.to(out_ptr.dtype.element_ty), mask=qm)

    @triton.jit
    def _combine_kernel(part_ptr, ml_ptr, out_ptr, heads, dim, splits, o_s0, o_s1, BLOCK_H: tl.constexpr,
                        BLOCK_D: tl.constexpr):
        """Merge a token's split states: ``out = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s``."""
        hblocks = tl.cdiv(heads, BLOCK_H)
        t = (tl.program_id(0) // hblocks).to(tl.int64)
        h = (tl.program_id(0) % hblocks) * BLOCK_H + tl.arange(0, BLOCK_H)
        d = tl.arange(0, BLOCK_D)
        hm = h < heads
        qm = hm[:, None] & (d[None, :] < dim)
        m = tl.full([BLOCK_H], float("-inf"), tl.float32)
        l = tl.zeros([BLOCK_H], dtype=tl.float32)
        acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
        for sp in range(splits):
            base = t * splits + sp
            m_s = tl.load(ml_ptr + (base * 2) * heads + h, mask=hm, other=0.0)  # finite: at least the sink
            l_s = tl.load(ml_ptr + (base * 2 + 1) * heads + h, mask=hm, other=0.0)
            a_s = tl.load(part_ptr + (base * heads + h[:, None]) * dim + d[None, :], mask=qm, other=0.0)
            m_new = tl.maximum(m, m_s)
            c, c_s = tl.exp(m - m_new), tl.exp(m_s - m_new)
            l = l * c + l_s * c_s
            acc = acc * c[:, None] + a_s * c_s[:, None]
            m = m_new
        out = acc / tl.where(hm, l, 1.0)[:, None]  # l >= 1 on real heads (split 0 holds the sink's 1)
        tl.store(out_ptr + t * o_s0 + h[:, None] * o_s1 + d[None, :], out.to(out_ptr.dtype.element_ty), mask=qm)


def _even_rows(*views: torch.Tensor) -> bool:
    """Every row of every view starts at an even element (for byte rows: a 2-byte aligned bf16 RoPE part)."""
    return all(v.stride(0) % 2 == 0 and v.storage_offset() % 2 == 0 for v in views)


def key_splits(programs: int, n_keys: int, rows_per_step: int, split_below: int) -> tuple[int, int]:
    """``(splits, keys per split)`` of each token's key list: unsplit (``(1, n_keys)``) when ``programs``
    (tokens x head blocks) reach ``split_below`` (the GPU is full), else enough splits to reach it, each
    at least two steps of ``rows_per_step`` keys (a multiple of it) and none empty."""
    if programs >= split_below or n_keys <= 2 * rows_per_step:
        return 1, max(n_keys, 1)
    want = min(-(-split_below // programs), -(-n_keys // (2 * rows_per_step)))
    per = -(-(-(-n_keys // want)) // rows_per_step) * rows_per_step
    return -(-n_keys // per), per


def sparse_attention(q: torch.Tensor, window_rows: torch.Tensor, window_idx: torch.Tensor,
                     comp_rows: torch.Tensor | None, comp_idx: torch.Tensor | None, sink: torch.Tensor, *,
                     scale: float, codec: RowCodec = None) -> torch.Tensor:
    """Attention of ``q`` over the rows named by two index tensors, with a per-head sink.

    Args:
        q: ``[T, H, D]`` fp32 or bf16, inner dim contiguous.
        window_rows: ``[Nw, D]`` SWA row view (same dtype as q); window_idx: int32 ``[T, W]``, -1 masked.
        comp_rows: ``[Nc, D]`` compressed row view or None; comp_idx: int32 ``[T, Kc]`` or None.
        sink: fp32 ``[H]`` per-head sink logit. scale: softmax scale (e.g. ``D ** -0.5``).
        codec: None when window and compressed rows are plain rows of q's dtype; the
            :class:`Fp8DsMlaLayout` of both when they are uint8 ``fp8_ds_mla`` rows.

    Returns ``[T, H, D]`` in q's dtype. Raises ValueError before launch on bad arguments. A batch with
    fewer programs than ``Tiles.attn_split_below`` splits each token's key list (:func:`key_splits`) and
    merges the splits in a second kernel; the split count follows from shapes only (no device read).
    Inside :func:`~atom.kernels.key_blocks.fixed_key_blocks` (batch-invariant models) the list is never
    split, so a token's output does not depend on how wide its lists are padded nor on the step's other
    tokens (a trailing step of masked keys leaves the online-softmax state unchanged).
    """
    _check(q, window_rows, window_idx, comp_rows, comp_idx, sink, scale, codec)
    require_triton("sparse_attention")
    num_tokens, heads, dim = q.shape
    out = torch.empty_like(q)
    if num_tokens == 0:
        return out
    has_comp = comp_rows is not None and comp_idx.shape[1] > 0
    crows, cidx = (comp_rows, comp_idx) if has_comp else (window_rows, window_idx)
    tiles = tiles_for(q.device)
    block_h = max(16, min(next_pow2(heads), tiles.attn_heads))
    block_d = max(16, next_pow2(dim))
    programs = num_tokens * triton.cdiv(heads, block_h)
    n_keys = window_idx.shape[1] + (cidx.shape[1] if has_comp else 0)
    # a batch-invariant model (fixed key blocks) never splits (a threshold of 0): the split count follows the
    # step's shape, and an unsplit walk over whole BLOCK_N steps gives a query the same bits however padded
    split_below = 0 if key_blocks_on() else tiles.attn_split_below
    splits, split_len = key_splits(programs, n_keys, tiles.attn_rows, split_below)
    part = torch.empty(num_tokens, splits, heads, dim, dtype=torch.float32, device=q.device) if splits > 1 else out
    ml = torch.empty(num_tokens, splits, 2, heads, dtype=torch.float32, device=q.device) if splits > 1 else out
    fmt = {k: v for k, v in codec_constexprs(codec).items() if k in ("FMT", "NOPE", "ROPE", "QBLOCK")}
    _sparse_attention_kernel[(programs * splits,)](
        q, out, part, ml, window_rows, window_idx, crows, cidx, sink, heads, dim, window_idx.shape[1], cidx.shape[1],
        splits, split_len, q.stride(0), q.stride(1), out.stride(0), out.stride(1), window_rows.stride(0),
        crows.stride(0), scale, HAS_COMP=has_comp, SPLIT=splits > 1, BLOCK_H=block_h, BLOCK_N=tiles.attn_rows,
        BLOCK_D=block_d, BF16=q.dtype == torch.bfloat16, NATIVE=tiles.native_bf16_dot,
        ALIGNED=_even_rows(window_rows, crows), num_warps=tiles.attn_warps, **fmt)
    if splits > 1:
        _combine_kernel[(programs,)](part, ml, out, heads, dim, splits, out.stride(0), out.stride(1), BLOCK_H=block_h,
                                     BLOCK_D=block_d, num_warps=tiles.attn_warps)
    return out
