"""Lightning-indexer scores of each query over its candidate keys, read from the arena's key rows.

Contract. For query token ``t`` with head queries ``q[t] [nI, cI]`` and head weights ``w[t] [nI]``, and
candidate key rows ``key_rows[key_idx[t, n]]`` (``-1`` = no candidate)::

    scores[t, n] = sum_h w'[t, h] * relu(<q[t, h], K_n>)        (-inf where key_idx[t, n] == -1)

with ``w' = w * w_scale`` computed as torch multiplies a tensor by a Python float (in fp32, rounded to ``w``'s
dtype; ``w_scale`` 1 leaves ``w`` as it is): the indexer's ``weights_proj(x) * weight_scale`` folded in, so the
model hands over the projection's output without a separate multiply.

The key rows are plain fp32/bf16 rows (``codec=None``) or uint8 FP8 key rows (``codec`` = their
:class:`~atom.kernels.fp8_index_key.Fp8IndexKeyLayout`). The Triton kernel decodes FP8 keys tile by
tile in registers (one program per token and block of candidates; bf16 tensor-core dots when the
queries are bf16 and the keys bf16 or FP8, both exact in bf16; fp32 IEEE dots otherwise);
no dequantized copy of the keys is made. The reference gathers and decodes each token's valid keys
and evaluates exactly the reference model's ``Indexer.score`` expression on them, so the engine's
picks equal the reference model's bit for bit on the torch path.
"""

from __future__ import annotations

import torch

from ._common import (HAS_TRITON, VALUE_DTYPES, check_index, check_range, check_rows, check_same_device, next_pow2,
                      require_triton, triton, tl)
from .key_blocks import block_scores, key_blocks_on
from .tiles import tiles_for
from .kv_rows import RowCodec, check_value_rows, codec_constexprs, decode_rows_ref, row_width

__all__ = ["index_score", "index_score_ref"]


def _check(q, w, key_rows, key_idx, codec) -> None:
    check_rows("q", q, ndim=3, dtypes=VALUE_DTYPES)
    num_tokens, heads, dim = q.shape
    check_rows("w", w, dtypes=VALUE_DTYPES, width=heads)
    if w.shape[0] != num_tokens:
        raise ValueError(f"w has {w.shape[0]} rows, q has {num_tokens} tokens")
    if codec is None:
        check_rows("key_rows", key_rows, dtypes=VALUE_DTYPES, width=dim)
    else:
        check_value_rows("key_rows", key_rows, "q", None, codec)
        if row_width(key_rows, codec) != dim:
            raise ValueError(f"key_rows hold keys of {row_width(key_rows, codec)} values, q has {dim} dims")
    check_index("key_idx", key_idx, (num_tokens, None))
    check_range("key_idx", key_idx, -1, key_rows.shape[0], "rows of key_rows, or -1 = no candidate")
    check_same_device(q=q, w=w, key_rows=key_rows, key_idx=key_idx)


def _check_scale(w_scale: float) -> None:
    if not isinstance(w_scale, float) or not w_scale > 0 or w_scale == float("inf"):
        raise ValueError(f"w_scale must be a finite float > 0, got {w_scale!r}")


def index_score_ref(q: torch.Tensor, w: torch.Tensor, key_rows: torch.Tensor, key_idx: torch.Tensor, *,
                    codec: RowCodec = None, w_scale: float = 1.0) -> torch.Tensor:
    """Torch reference of :func:`index_score` (same contract); inside
    :func:`~atom.kernels.key_blocks.fixed_key_blocks` each query's dots over fixed blocks of keys (that
    module's docstring), so its scores do not depend on how wide its candidate list is padded."""
    _check(q, w, key_rows, key_idx, codec)
    _check_scale(w_scale)
    if w_scale != 1.0:
        w = w * w_scale  # the model's own multiply (Indexer.head_weights)
    t, n = key_idx.shape
    keys = decode_rows_ref(key_rows[key_idx.long().clamp(min=0).reshape(-1)], codec).reshape(t, n, -1)
    dots = block_scores(q.float(), keys.float()) if key_blocks_on() else q.float() @ keys.float().transpose(1, 2)
    scores = (torch.relu(dots) * w.float()[:, :, None]).sum(dim=1)
    return torch.where(key_idx >= 0, scores, float("-inf"))


if HAS_TRITON:
    from ._common import mma
    from .kv_rows import load_rows
    from .store_rounding import rounded_for

    @triton.jit
    def _index_score_kernel(q_ptr, w_ptr, rows_ptr, idx_ptr, out_ptr, heads, dim, n_idx, q_s0, q_s1, w_s0,
                            rows_stride, w_scale, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
                            BLOCK_D: tl.constexpr, FMT: tl.constexpr, NOPE: tl.constexpr, ROPE: tl.constexpr,
                            QBLOCK: tl.constexpr, BF16: tl.constexpr, NATIVE: tl.constexpr, SCALED: tl.constexpr):
        t = tl.program_id(0).to(tl.int64)
        n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        h = tl.arange(0, BLOCK_H)
        d = tl.arange(0, BLOCK_D)
        q = tl.load(q_ptr + t * q_s0 + h[:, None] * q_s1 + d[None, :], mask=(h[:, None] < heads) & (d[None, :] < dim),
                    other=0.0).to(tl.float32)
        w = tl.load(w_ptr + t * w_s0 + h, mask=h < heads, other=0.0)
        if SCALED:  # torch's tensor * float: in fp32, rounded to w's dtype
            w = rounded_for(w.to(tl.float32) * w_scale, w_ptr.dtype.element_ty)
        w = w.to(tl.float32)
        idx = tl.load(idx_ptr + t * n_idx + n, mask=n < n_idx, other=-1)
        valid = idx >= 0
        k = load_rows(rows_ptr, idx.to(tl.int64) * rows_stride, valid, d, dim, FMT, NOPE, ROPE, QBLOCK)
        s = tl.maximum(mma(q, tl.trans(k), BF16, NATIVE), 0.0)  # [BLOCK_H, BLOCK_N]
        score = tl.sum(s * w[:, None], axis=0)
        tl.store(out_ptr + t * n_idx + n, tl.where(valid, score, float("-inf")), mask=n < n_idx)


def _bf16_keys(q: torch.Tensor, key_rows: torch.Tensor, codec: RowCodec) -> bool:
    """bf16 tensor-core dots when both operands are exact in bf16: bf16 queries, and bf16 keys or FP8 keys
    (e4m3 times a power-of-two scale fits bf16's 8-bit mantissa and exponent range)."""
    return q.dtype == torch.bfloat16 and (codec is not None or key_rows.dtype == torch.bfloat16)


def index_score(q: torch.Tensor, w: torch.Tensor, key_rows: torch.Tensor, key_idx: torch.Tensor, *,
                codec: RowCodec = None, w_scale: float = 1.0) -> torch.Tensor:
    """Indexer scores ``[T, N]`` fp32 of every query over its candidates.

    Args:
        q: ``[T, nI, cI]`` indexer queries (fp32/bf16, inner dim contiguous); w: ``[T, nI]`` head weights.
        key_rows: ``[num_rows, cI]`` plain key rows, or uint8 ``[num_rows, codec.row_bytes]`` FP8 keys.
        key_idx: int32 ``[T, N]`` candidate key rows per query, -1 = none (scored -inf).
        codec: None for plain rows, else the :class:`Fp8IndexKeyLayout` of the byte rows.
        w_scale: a float > 0 the head weights are multiplied by first (module docstring).

    Raises ValueError before launch on bad arguments.
    """
    _check(q, w, key_rows, key_idx, codec)
    _check_scale(w_scale)
    require_triton("index_score")
    num_tokens, heads, dim = q.shape
    out = torch.empty(key_idx.shape, dtype=torch.float32, device=q.device)
    if out.numel() == 0:
        return out
    block_n = tiles_for(q.device).score_rows
    fmt = {k: v for k, v in codec_constexprs(codec).items() if k in ("FMT", "NOPE", "ROPE", "QBLOCK")}
    grid = (num_tokens, triton.cdiv(key_idx.shape[1], block_n))
    _index_score_kernel[grid](q, w, key_rows, key_idx, out, heads, dim, key_idx.shape[1], q.stride(0), q.stride(1),
                              w.stride(0), key_rows.stride(0), w_scale, BLOCK_H=max(16, next_pow2(heads)),
                              BLOCK_N=block_n, BLOCK_D=max(16, next_pow2(dim)), BF16=_bf16_keys(q, key_rows, codec),
                              NATIVE=tiles_for(q.device).native_bf16_dot, SCALED=w_scale != 1.0, **fmt)
    return out
