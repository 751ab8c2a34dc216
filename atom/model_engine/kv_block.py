"""A logical KV block and the chained block hash.

A block covers ``block_size`` consecutive token positions of a sequence. Its hash chains the hash of
the block before it with this block's token ids (xxhash64), so equal hashes mean equal prefixes; the
stored token ids are compared on every hit anyway, so a hash collision can never serve wrong KV.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass
from typing import Sequence

__all__ = ["Block", "hash_block", "chain_hashes"]


def hash_block(prev_hash: int | None, token_ids: Sequence[int]) -> int:
    """xxhash64 of (previous block's hash, this block's token ids)."""
    import xxhash  # a declared dependency; imported here so the control plane imports on the stdlib alone

    h = xxhash.xxh64()
    if prev_hash is not None:
        h.update(prev_hash.to_bytes(8, "little"))
    h.update(array("q", token_ids).tobytes())
    return h.intdigest()


def chain_hashes(token_ids: Sequence[int], block_size: int, num_blocks: int,
                 prev: Sequence[int] = ()) -> list[int]:
    """Hashes of the first ``num_blocks`` full blocks, reusing ``prev`` (already computed ones)."""
    out = list(prev[:num_blocks])
    for j in range(len(out), num_blocks):
        out.append(hash_block(out[-1] if out else None, token_ids[j * block_size:(j + 1) * block_size]))
    return out


@dataclass(slots=True)
class Block:
    """One logical block id of a pool.

    ``ref_count`` counts sequences holding it (plus one for a retention pin); ``block_hash`` and
    ``token_ids`` are set while it is published in the prefix cache. A block in the pool's vacant
    list has ref 0, no hash and no arena page. ``state_captured`` (SWA blocks only) records that the
    fused CSA boundary state of this block was written.
    """

    block_id: int
    ref_count: int = 0
    block_hash: int | None = None
    token_ids: tuple[int, ...] | None = None
    state_captured: bool = False
    index: int = -1  # block index in its prompt while published (SWA blocks: what a hit there unlocks)
    cached_at: int = 0  # the pool's cache clock when it was last cached (its age for eviction)

    def reset(self) -> None:
        """Back to a clean, vacant state (ref 0: ATOM's reset to ref 1 crashed on reuse)."""
        self.ref_count = 0
        self.block_hash = None
        self.token_ids = None
        self.state_captured = False
        self.index = -1
