"""Fixed key blocks: the torch references' arithmetic over key lists in a form whose result for one query does
not depend on how wide its list is padded, nor on the other queries of the step.

Why. A decode step's index lists are as wide as the step's widest need: a step padded to a captured graph's
buckets has lists as wide as its context bucket, an unpadded eager step lists as wide as its longest
request, so a request's lists are widened with ``-1`` entries by whatever else runs with it. The plain
references compute on the whole list at once, and on the CPU both of its reductions round by the width:
a GEMM over ``n`` keys picks its kernel by ``n`` (MKL's fp32 ``[4, 16] @ [16, n]`` gives other last bits for
``n = 8`` than the first 8 columns of ``n = 16``), and a sum over the list is split into vector lanes by
its length. So even a batch-invariant model (every token-local op one row at a time) computed a
request's attention and indexer scores differently in different company.

How. Inside :func:`fixed_key_blocks`, ``sparse_attention_ref`` and ``index_score_ref`` cut each query's
key list into blocks of :data:`KEY_BLOCK` keys (the last one padded with zero keys) and run every GEMM on
one block's fixed shape (one ``bmm`` whose batch is queries x blocks; the CPU's batched GEMM computes each
batch entry alike whatever the batch count), and add the blocks' partial sums one after another in
list order. A trailing block of masked keys contributes exact zeros (``x + 0.0 == x``), and a block's
result depends only on its own keys, so a list widened with ``-1`` entries (which sit after the real
ones: window lists are fixed, compressed lists ascending) gives the same bits, as does a step with
other queries in it. The Triton attention kernel walks a list in whole steps of its own, from the
sink, so a trailing step of masked keys leaves its state unchanged too; what made it depend on the step
was splitting long lists by the step's shape (``key_splits``), which it does not do inside the scope.

Cost: keys padded to a multiple of the block and one addition per block, so the engine turns it on only
for batch-invariant models (``DeepseekV4Config.batch_invariant``); the default path is unchanged.
Outside the scope the references compute as they always did.
"""

from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Iterator

import torch
import torch.nn.functional as F

__all__ = ["KEY_BLOCK", "block_partial_sums", "block_scores", "fixed_key_blocks", "key_blocks_on"]

#: keys per block: at least 16, below which MKL's fp32 GEMM changes kernel with the key count
KEY_BLOCK = 64

_ON: ContextVar[bool] = ContextVar("atom_fixed_key_blocks", default=False)


@contextmanager
def fixed_key_blocks(on: bool = True) -> Iterator[None]:
    """Inside the block (when ``on``), the key-list references compute over fixed key blocks."""
    token = _ON.set(bool(on))
    try:
        yield
    finally:
        _ON.reset(token)


def key_blocks_on() -> bool:
    """Whether the current scope asked for fixed key blocks."""
    return _ON.get()


def _blocks(keys: torch.Tensor) -> torch.Tensor:
    """``keys [T, K, D]`` as ``[T * nb, KEY_BLOCK, D]``, zero keys after the last one."""
    t, k, d = keys.shape
    nb = max(1, -(-k // KEY_BLOCK))
    return F.pad(keys, (0, 0, 0, nb * KEY_BLOCK - k)).reshape(t * nb, KEY_BLOCK, d)


def block_scores(q: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """``q @ keys^T`` per query: ``q [T, H, D]``, ``keys [T, K, D]`` -> ``[T, H, K]``, each block of
    :data:`KEY_BLOCK` keys by a GEMM of one fixed shape."""
    t, h, d = q.shape
    k = keys.shape[1]
    kb = _blocks(keys)
    nb = kb.shape[0] // t
    qb = q[:, None].expand(t, nb, h, d).reshape(t * nb, h, d)
    s = torch.bmm(qb, kb.transpose(1, 2)).view(t, nb, h, KEY_BLOCK)
    return s.permute(0, 2, 1, 3).reshape(t, h, nb * KEY_BLOCK)[..., :k]


def block_partial_sums(p: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(p.sum(-1), p @ values)`` per query: ``p [T, H, K]``, ``values [T, K, D]`` -> ``([T, H], [T, H, D])``;
    each block of :data:`KEY_BLOCK` keys is reduced on its own (a fixed-length sum, a GEMM of one fixed
    shape), and the blocks' partials are added in list order."""
    t, h, k = p.shape
    vb = _blocks(values)
    nb = vb.shape[0] // t
    pb = F.pad(p, (0, nb * KEY_BLOCK - k)).view(t, h, nb, KEY_BLOCK)
    sums = pb.sum(-1)  # [T, H, nb]
    pv = torch.bmm(pb.permute(0, 2, 1, 3).reshape(t * nb, h, KEY_BLOCK), vb).view(t, nb, h, -1)
    total, out = sums[..., 0], pv[:, 0]
    for b in range(1, nb):
        total, out = total + sums[..., b], out + pv[:, b]
    return total, out
