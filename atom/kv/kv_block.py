"""The chained block hash and the exact key of a block's tokens.

A block covers ``block_size`` consecutive token positions of a sequence. Its key is the block's
token ids packed as int32 bytes (every vocabulary's ids fit, in half the bytes of int64: the prefix
index keeps one key per cached block, and a hit compares them); its hash is xxhash64 of that key
seeded with the previous block's hash, so equal hashes mean equal prefixes with overwhelming
probability. The hash only *finds* a candidate: a hit is verified exactly (the candidate's parent is
the block accepted just before and its key equals the query's, see :mod:`atom.kv.prefix_index`), so
a hash collision can never serve KV computed under another prefix.

Both are computed once per block per request (``Sequence.hashes_upto``) from one packing of the
token ids, with no per-block tuple of Python ints.
"""

from __future__ import annotations

from array import array
from typing import Sequence

__all__ = ["chain_hashes", "ROOT_SEED"]

ROOT_SEED = 0  # the seed of block 0's hash (no previous block)


def chain_hashes(token_ids: Sequence[int], block_size: int, num_blocks: int,
                 hashes: list[int], keys: list[bytes]) -> None:
    """Extend ``hashes`` and ``keys`` (the first blocks, already computed) to ``num_blocks`` full blocks."""
    import xxhash  # a declared dependency; imported here so the control plane imports on the stdlib alone

    start = len(hashes)
    if start >= num_blocks:
        return
    step = block_size * 4
    try:
        packed = array("i", token_ids[start * block_size:num_blocks * block_size]).tobytes()
    except OverflowError:
        raise ValueError(f"a token id outside the 32-bit range in blocks {start}..{num_blocks - 1}; a block key "
                         f"packs each id in 4 bytes (-2**31 <= id < 2**31; vocabulary ids fit)") from None
    digest = xxhash.xxh64_intdigest
    prev = hashes[-1] if hashes else ROOT_SEED
    for off in range(0, len(packed), step):
        key = packed[off:off + step]
        prev = digest(key, prev)
        hashes.append(prev)
        keys.append(key)
