"""What the KV memory reads and writes of a request: the step loop's ``Sequence`` seen from the arena.

The block manager is handed the step loop's requests but must not import the step loop (the KV
package sits below it), so it names the attributes it uses here, structurally: any object with
these attributes is a request to it.
"""

from __future__ import annotations

from typing import Protocol

from atom.kv.prefix_stats import PrefixStats

__all__ = ["KvRequest"]


class KvRequest(Protocol):
    """A request's tokens and progress, as the block manager uses them.

    ``num_computed_tokens`` / ``num_cached_tokens`` are written at admission (the prefix hit);
    ``block_hashes`` / ``block_keys`` grow through :meth:`hashes_upto`; ``stats`` is filled at the
    first admission.
    """

    seq_id: int
    token_ids: list[int]
    num_prompt_tokens: int
    num_computed_tokens: int
    num_cached_tokens: int
    num_preemptions: int
    block_hashes: list[int]
    block_keys: list[bytes]
    stats: PrefixStats

    def __len__(self) -> int: ...

    def hashes_upto(self, num_blocks: int) -> list[int]:
        """The chained hashes of at least the first ``num_blocks`` full blocks."""
        ...
