"""A counter-based random generator on the device: uniforms that are a pure function of a key and a counter.

A sampled token needs random numbers that depend only on *which* draw it is, not on what else ran
before it or beside it in the batch. A stateful generator (``torch.Generator``) hands out its stream in
call order, so a request's draws would depend on the batch it runs in; a per-request generator means
one generator object, and one sampling call, per row. Here every draw is ``hash(key, counter)``:
a row's key comes from the request's ``(seed, output position)``, the counter is the column (a
vocabulary id, or one extra column for the rejection test), and one batched op produces the whole
``[rows, columns]`` block, whatever the batch.

The hash is ``lowbias32`` (Chris Wellons' 32-bit integer finaliser, xor-shift / multiply rounds).
It is computed in int64 tensors whose values stay in ``[0, 2**32)``: the 32-bit products are split
into 16-bit halves so nothing overflows int64 and ``>>`` on non-negative values is a logical shift.
The same arithmetic runs on every device, so a key gives the same uniforms on the CPU and on a GPU.
Not cryptographic; for sampling only.
"""

from __future__ import annotations

import torch

__all__ = ["MASK32", "hash32", "row_keys", "uniforms"]

MASK32 = 0xFFFFFFFF
_GOLDEN = 0x9E3779B9  # separates the counter stream from the key stream


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """``(x * c) mod 2**32`` for ``x`` in ``[0, 2**32)`` without int64 overflow (``c`` split in 16-bit halves)."""
    lo, hi = c & 0xFFFF, c >> 16
    return (x * lo + (((x * hi) & 0xFFFF) << 16)) & MASK32


def hash32(x: torch.Tensor) -> torch.Tensor:
    """``lowbias32`` of every element of the int64 tensor ``x`` (values in ``[0, 2**32)``)."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def row_keys(seed_lo: torch.Tensor, seed_hi: torch.Tensor, position: torch.Tensor) -> torch.Tensor:
    """The key of each row's draws: a hash of its request's seed (two 32-bit halves of ``seed mod 2**64``)
    and the output position it samples. int64 tensors ``[B]`` in, int64 ``[B]`` (32-bit values) out."""
    return hash32(hash32(hash32(seed_lo) ^ seed_hi) ^ position)


def uniforms(keys: torch.Tensor, columns: int) -> torch.Tensor:
    """fp32 uniforms ``[B, columns]`` in the open interval (0, 1): element ``[r, c]`` depends on ``keys[r]``
    and ``c`` only (24 random bits, ``(bits + 0.5) / 2**24``, exact in fp32)."""
    counter = hash32((torch.arange(columns, dtype=torch.int64, device=keys.device) + _GOLDEN) & MASK32)
    bits = hash32(keys.unsqueeze(-1) ^ counter) >> 8
    return (bits.to(torch.float32) + 0.5) * (1.0 / (1 << 24))
