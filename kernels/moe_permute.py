"""The fused MoE's device-side permutation in one launch: (token, expert) pairs sorted by expert.

Contract (:func:`moe_permute`; the torch form is ``fused_moe._permute``: ``torch.sort(stable=True)`` of the
keys, then ``searchsorted``)::

    moe_permute(route_idx [T, k] int32/int64, num_experts E, first_expert, zero=None, init=None)
        -> (order [T*k] int64, offsets [E + 1] int32)

* Pair ``p = t * k + j`` has key ``route_idx[t, j] - first_expert``; keys outside ``[0, E)`` (experts held by
  another rank) count as ``E``.
* ``offsets[e]`` is the number of pairs with key ``< e`` (so ``offsets[0] == 0`` and ``offsets[E]`` is the number
  of pairs held here); ``order[offsets[e] : offsets[e + 1]]`` are the pairs of stacked expert ``e`` in ascending
  pair order: exactly the stable sort's. ``order[offsets[E]:]`` (other ranks' pairs) is left unspecified: the
  grouped GEMMs never read past ``offsets[E]``.
* ``zero``: an fp32 tensor (the MoE's output, which the second GEMM accumulates into with atomics) that the same
  launch sets to 0, so the output needs no separate fill; or, with ``init`` (a contiguous fp32 / bf16 / fp16
  tensor of as many elements: the shared expert's output), to ``init``'s values in fp32, so the routed sum
  lands on the shared expert's output with no separate add.

One launch, nothing read back: program 0 is a counting sort (a histogram of the keys chunk by chunk, the
exclusive prefix sum as ``offsets``, then each chunk's pairs placed at their expert's cursor plus their rank
among the chunk's pairs of the same expert, a ``[BP, BP]`` comparison); the other programs zero ``zero`` in
blocks (or copy ``init`` into it). Program 0 is serial over ``T*k / BP`` chunks: a few at decode, thousands for
a long prefill chunk, where the GEMMs dominate.
"""

from __future__ import annotations

import torch

from ._common import HAS_TRITON, next_pow2, require_triton, triton, tl

__all__ = ["moe_permute"]

#: pairs per chunk of the counting sort (the rank within a chunk is a [BP, BP] comparison)
BP = 64
#: fp32 elements each zeroing program clears
ZERO_BLOCK = 1024
#: dtypes ``init`` may have (the shared expert's output in the model's dtype)
_INIT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

if HAS_TRITON:

    @triton.jit
    def _chunk_keys(idx_ptr, p0, P, E, first_expert, stride_t, stride_k, K: tl.constexpr, BP: tl.constexpr):
        """``(pair ids, keys, in range)`` of chunk ``p0 .. p0 + BP``: key ``E`` for another rank's expert."""
        p = p0 + tl.arange(0, BP)
        ok = p < P
        key = tl.load(idx_ptr + (p // K) * stride_t + (p % K) * stride_k, mask=ok, other=0).to(tl.int32)
        key = key - first_expert
        key = tl.where((key < 0) | (key >= E), E, key)
        return p, key, ok

    @triton.jit
    def _moe_permute_kernel(idx_ptr, order_ptr, off_ptr, cursor_ptr, zero_ptr, init_ptr, P, E, first_expert, Z,
                            stride_t, stride_k, K: tl.constexpr, BP: tl.constexpr, E_PAD: tl.constexpr,
                            ZB: tl.constexpr, INIT: tl.constexpr):
        pid = tl.program_id(0)
        if pid > 0:
            z = (pid - 1).to(tl.int64) * ZB + tl.arange(0, ZB)
            if INIT:
                v = tl.load(init_ptr + z, mask=z < Z, other=0.0).to(tl.float32)
            else:
                v = tl.zeros((ZB,), dtype=tl.float32)
            tl.store(zero_ptr + z, v, mask=z < Z)
        else:
            counts = tl.zeros((E_PAD,), dtype=tl.int32)
            for p0 in range(0, P, BP):
                _, key, ok = _chunk_keys(idx_ptr, p0, P, E, first_expert, stride_t, stride_k, K, BP)
                counts += tl.histogram(key, E_PAD, mask=ok)
            e = tl.arange(0, E_PAD)
            cursor = tl.cumsum(counts, 0) - counts  # exclusive: the first place of each expert's run
            tl.store(off_ptr + e, cursor, mask=e <= E)
            tl.store(cursor_ptr + e, cursor)
            tl.debug_barrier()
            j = tl.arange(0, BP)
            for p0 in range(0, P, BP):
                p, key, ok = _chunk_keys(idx_ptr, p0, P, E, first_expert, stride_t, stride_k, K, BP)
                before = (key[:, None] == key[None, :]) & (j[None, :] < j[:, None]) & ok[None, :]
                rank = tl.sum(before.to(tl.int32), 1)
                place = tl.load(cursor_ptr + key, mask=ok, other=0) + rank
                tl.store(order_ptr + place, p.to(tl.int64), mask=ok & (key < E))
                cursor += tl.histogram(key, E_PAD, mask=ok)
                tl.debug_barrier()  # every lane has read the cursors before they move
                tl.store(cursor_ptr + e, cursor)
                tl.debug_barrier()


def moe_permute(route_idx: torch.Tensor, num_experts: int, first_expert: int = 0,
                zero: torch.Tensor | None = None, init: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(order, offsets)`` of the expert-sorted pairs (module docstring), setting ``zero`` to 0 (or to ``init``)
    in the same launch. The caller (``fused_moe``) has checked ``route_idx`` ([T, k] int32/int64)."""
    require_triton("moe_permute")
    if num_experts < 1 or first_expert < 0:
        raise ValueError(f"moe_permute: num_experts must be >= 1 and first_expert >= 0, got {num_experts}, "
                         f"{first_expert}")
    if zero is not None and (zero.dtype != torch.float32 or not zero.is_contiguous()):
        raise ValueError(f"moe_permute: zero must be a contiguous fp32 tensor, got {zero.dtype}")
    if init is not None and (zero is None or init.numel() != zero.numel() or not init.is_contiguous()
                             or init.dtype not in _INIT_DTYPES or init.device != zero.device):
        raise ValueError(f"moe_permute: init must be a contiguous fp32 / bf16 / fp16 tensor with zero's "
                         f"{None if zero is None else zero.numel()} elements on its device, got "
                         f"{init.dtype} {tuple(init.shape)} on {init.device}")
    dev = route_idx.device
    pairs = route_idx.numel()
    order = torch.empty(pairs, dtype=torch.int64, device=dev)
    offsets = torch.empty(num_experts + 1, dtype=torch.int32, device=dev)
    e_pad = next_pow2(num_experts + 1)
    cursor = torch.empty(e_pad, dtype=torch.int32, device=dev)
    z = 0 if zero is None else zero.numel()
    out = order if zero is None else zero  # a pointer the kernel never reads or writes when z == 0
    _moe_permute_kernel[(1 + triton.cdiv(z, ZERO_BLOCK),)](
        route_idx, order, offsets, cursor, out, out if init is None else init, pairs,
        num_experts, first_expert, z, route_idx.stride(0), route_idx.stride(1), K=route_idx.shape[1], BP=BP,
        E_PAD=e_pad, ZB=ZERO_BLOCK, INIT=init is not None)
    return order, offsets
