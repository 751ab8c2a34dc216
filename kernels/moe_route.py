"""The MoE router's selection and weights as one op, from the router logits.

Contract: ``logits [T, E]`` fp32 (``x @ gate.weight.T``), ``bias [E]`` fp32 or None, ``hash_idx [T, k]`` (int32 /
int64, the token's fixed experts on hash-routed layers) or None, ``topk`` ``k``, ``score_func`` (``softmax``,
``sigmoid`` or ``sqrtsoftplus``), ``route_scale``, and ``token_ids [T]`` (int32 / int64) or None -> ``(weights
[T, k]`` fp32, ``idx [T, k]`` int64), the reference ``Gate``'s rule. With ``token_ids``, ``hash_idx`` is the layer's
whole table ``[V, k]`` (``Gate.tid2eid``) and token ``t``'s picks are its row ``token_ids[t]``: the kernel gathers
them itself, so a hash-routed layer launches no separate index op.

* ``scores = softmax(logits)`` / ``sigmoid(logits)`` / ``sqrt(softplus(logits))`` (softplus is ``x`` above 20);
* ``idx``: ``hash_idx`` when given, else the ``k`` largest ``scores + bias`` in descending order, ties to the lower
  expert (a stable descending sort);
* ``weights = scores[idx]``, divided by their sum unless ``softmax``, times ``route_scale``.

:func:`moe_route_ref` is the reference's torch arithmetic (about eight ops after the GEMM); :func:`moe_route` is
one Triton launch, each program a tile of tokens with their ``E`` scores in registers and ``k`` rounds of
arg-max. ``exp`` / ``log``
may differ from torch's in the last bit of fp32, and the kernel's softplus is ``log(1 + exp(x))`` where torch's
uses ``log1p`` (a relative difference near fp32's epsilon for very negative logits).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._common import HAS_TRITON, check_range, next_pow2, require_triton, triton, tl
from .store_rounding import elements_per_program

__all__ = ["moe_route", "moe_route_ref", "SCORE_FUNCS"]

SCORE_FUNCS = ("softmax", "sigmoid", "sqrtsoftplus")


def _check(logits: torch.Tensor, bias: torch.Tensor | None, hash_idx: torch.Tensor | None, topk: int,
           score_func: str, route_scale: float, token_ids: torch.Tensor | None = None) -> None:
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2 or logits.dtype != torch.float32:
        raise ValueError(f"logits must be an fp32 [T, E] tensor, got {getattr(logits, 'dtype', type(logits).__name__)} "
                         f"{tuple(getattr(logits, 'shape', ()))}")
    t, e = logits.shape
    if not isinstance(topk, int) or not 1 <= topk <= e:
        raise ValueError(f"topk must be an int in 1..{e} (the expert count), got {topk!r}")
    if bias is not None and (not isinstance(bias, torch.Tensor) or bias.shape != (e,) or bias.dtype != torch.float32):
        raise ValueError(f"bias must be None or an fp32 [{e}] tensor, got {tuple(getattr(bias, 'shape', ()))}")
    if token_ids is not None:
        if hash_idx is None or not isinstance(token_ids, torch.Tensor) or token_ids.shape != (t,) \
                or token_ids.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"token_ids must be an int32/int64 [{t}] tensor given with a hash table, got "
                             f"{tuple(getattr(token_ids, 'shape', ()))} (hash table given: {hash_idx is not None})")
        if not isinstance(hash_idx, torch.Tensor) or hash_idx.dim() != 2 or hash_idx.shape[1] != topk \
                or hash_idx.dtype not in (torch.int32, torch.int64):
            raise ValueError(f"hash_idx with token_ids must be an int32/int64 table [V, {topk}], got "
                             f"{tuple(getattr(hash_idx, 'shape', ()))}")
        check_range("token_ids", token_ids, 0, hash_idx.shape[0], "the hash table's rows")
    elif hash_idx is not None and (not isinstance(hash_idx, torch.Tensor) or hash_idx.shape != (t, topk)
                                   or hash_idx.dtype not in (torch.int32, torch.int64)):
        raise ValueError(f"hash_idx must be None or an int32/int64 [{t}, {topk}] tensor, got "
                         f"{tuple(getattr(hash_idx, 'shape', ()))}")
    if score_func not in SCORE_FUNCS:
        raise ValueError(f"score_func {score_func!r}; accepted: {', '.join(SCORE_FUNCS)}")
    if not isinstance(route_scale, float):
        raise ValueError(f"route_scale must be a float, got {route_scale!r}")


def moe_route_ref(logits: torch.Tensor, bias: torch.Tensor | None, hash_idx: torch.Tensor | None, topk: int,
                  score_func: str, route_scale: float, token_ids: torch.Tensor | None = None
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Torch reference of :func:`moe_route` (same contract): the reference ``Gate``'s arithmetic."""
    _check(logits, bias, hash_idx, topk, score_func, route_scale, token_ids)
    if token_ids is not None:
        hash_idx = hash_idx[token_ids]
    if score_func == "softmax":
        scores = logits.softmax(dim=-1)
    elif score_func == "sigmoid":
        scores = torch.sigmoid(logits)
    else:
        scores = torch.sqrt(F.softplus(logits))
    if hash_idx is not None:
        idx = hash_idx.long()
    else:
        biased = scores if bias is None else scores + bias
        idx = torch.sort(biased, dim=-1, descending=True, stable=True).indices[:, :topk]
    w = scores.gather(1, idx)
    if score_func != "softmax":
        w = w / w.sum(dim=-1, keepdim=True)
    return w * route_scale, idx


if HAS_TRITON:

    @triton.jit
    def _moe_route_kernel(logit_ptr, bias_ptr, hash_ptr, tid_ptr, w_ptr, idx_ptr, tokens, n_experts, route_scale,
                          K: tl.constexpr, K_PAD: tl.constexpr, E_PAD: tl.constexpr, BLOCK_T: tl.constexpr,
                          FUNC: tl.constexpr, HAS_BIAS: tl.constexpr, HASHED: tl.constexpr, GATHER: tl.constexpr):
        t = tl.program_id(0).to(tl.int64) * BLOCK_T + tl.arange(0, BLOCK_T)
        e = tl.arange(0, E_PAD)
        tok = t < tokens
        hash_row = t
        if GATHER:  # the hash table's row of each token's id
            hash_row = tl.load(tid_ptr + t, mask=tok, other=0).to(tl.int64)
        live = (e < n_experts)[None, :]
        x = tl.load(logit_ptr + t[:, None] * n_experts + e[None, :], mask=tok[:, None] & live, other=0.0)
        x = tl.where(live, x, float("-inf"))
        if FUNC == 0:  # softmax
            p = tl.exp(x - tl.max(x, axis=1)[:, None])
            scores = p / tl.sum(p, axis=1)[:, None]
        elif FUNC == 1:  # sigmoid
            scores = tl.sigmoid(x)
        else:  # sqrt(softplus)
            xs = tl.where(live, x, 0.0)
            scores = tl.sqrt(tl.where(xs > 20.0, xs, tl.log(1.0 + tl.exp(xs))))
        scores = tl.where(live, scores, 0.0)
        biased = scores
        if HAS_BIAS:
            biased = scores + tl.load(bias_ptr + e, mask=e < n_experts, other=0.0)[None, :]
        biased = tl.where(live, biased, float("-inf"))
        kk = tl.arange(0, K_PAD)[None, :]
        w = tl.zeros((BLOCK_T, K_PAD), tl.float32)
        ids = tl.zeros((BLOCK_T, K_PAD), tl.int64)
        for i in tl.static_range(K):
            if HASHED:
                j = tl.load(hash_ptr + hash_row * K + i, mask=tok, other=0).to(tl.int32)
            else:
                best = tl.max(biased, axis=1)
                j = tl.min(tl.where(biased == best[:, None], e[None, :], E_PAD), axis=1)
                biased = tl.where(e[None, :] == j[:, None], float("-inf"), biased)
            wj = tl.sum(tl.where(e[None, :] == j[:, None], scores, 0.0), axis=1)
            w = tl.where(kk == i, wj[:, None], w)
            ids = tl.where(kk == i, j.to(tl.int64)[:, None], ids)
        if FUNC != 0:
            w = w / tl.sum(w, axis=1)[:, None]
        ok = tok[:, None] & (kk < K)
        tl.store(w_ptr + t[:, None] * K + kk, w * route_scale, mask=ok)
        tl.store(idx_ptr + t[:, None] * K + kk, ids, mask=ok)


def moe_route(logits: torch.Tensor, bias: torch.Tensor | None, hash_idx: torch.Tensor | None, topk: int,
              score_func: str, route_scale: float, token_ids: torch.Tensor | None = None
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """The routing weights and experts of every token (see the module docstring); one launch."""
    _check(logits, bias, hash_idx, topk, score_func, route_scale, token_ids)
    require_triton("moe_route")
    devices = {logits.device} | {a.device for a in (bias, hash_idx, token_ids) if a is not None}
    if len(devices) != 1:
        raise ValueError("logits, bias, hash_idx and token_ids must share a device")
    t, e = logits.shape
    lg = logits.contiguous()
    w = torch.empty(t, topk, dtype=torch.float32, device=lg.device)
    idx = torch.empty(t, topk, dtype=torch.int64, device=lg.device)
    if t:
        e_pad = next_pow2(e)
        block_t = max(1, min(next_pow2(t), elements_per_program(lg.device) // (4 * e_pad)))
        _moe_route_kernel[(triton.cdiv(t, block_t),)](
            lg, lg if bias is None else bias.contiguous(), lg if hash_idx is None else hash_idx.contiguous(),
            lg if token_ids is None else token_ids.contiguous(), w, idx, t, e, route_scale, K=topk,
            K_PAD=next_pow2(topk), E_PAD=e_pad, BLOCK_T=block_t, FUNC=SCORE_FUNCS.index(score_func),
            HAS_BIAS=bias is not None, HASHED=hash_idx is not None, GATHER=token_ids is not None)
    return w, idx
