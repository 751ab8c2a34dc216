"""The collectives of a sharded model (:mod:`atom.parallel` shards it): all-reduce of partial sums, all-gather of
vocabulary slices, and the all-to-all of rows that moves MoE tokens between attention replicas.

The model layers hold a :class:`Comm` (``SINGLE_RANK`` unless the model was sharded) and call it at
the few places where a rank's partial result must be combined: after the row-parallel ``wo_b`` of
attention, after the MoE (routed experts of this rank plus its slice of the shared expert), after
the vocab-parallel embedding lookup, and after the vocab-parallel LM head. On one rank every call
returns its input unchanged, so the unsharded model pays nothing.

Every rank of a group must make the same calls in the same order with tensors of the same shape:
that holds because every rank runs the same batch (the scheduler's frozen batch is broadcast).
A reduction's result is the same on every rank (the backend reduces each element once and sends
the result around), so replicated state (the latent KV, the indexer's choices) never diverges.
"""

from __future__ import annotations

import torch

__all__ = ["Comm", "SINGLE_RANK"]


class Comm:
    """Collectives over one process group: ``rank`` of ``size``; ``group=None`` with size 1 is local."""

    def __init__(self, rank: int = 0, size: int = 1, group: object | None = None) -> None:
        assert 0 <= rank < size, (rank, size)
        assert size == 1 or group is not None, "a group of several ranks needs a process group"
        self.rank, self.size, self.group = rank, size, group

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """The element-wise sum of ``x`` over the ranks (``x`` may be reduced in place; use the result)."""
        if self.size == 1:
            return x
        import torch.distributed as dist

        x = x.contiguous()
        dist.all_reduce(x, group=self.group)
        return x

    def all_gather(self, x: torch.Tensor, dim: int) -> torch.Tensor:
        """The ranks' ``x`` concatenated along ``dim`` in rank order (shapes must agree)."""
        if self.size == 1:
            return x
        import torch.distributed as dist

        x = x.contiguous()
        parts = [torch.empty_like(x) for _ in range(self.size)]
        dist.all_gather(parts, x, group=self.group)
        return torch.cat(parts, dim=dim)

    def all_to_all(self, x: torch.Tensor, send: list[int], recv: list[int]) -> torch.Tensor:
        """Rows ``x[sum(send[:r]) : sum(send[:r + 1])]`` go to rank ``r``; the result holds the rows every rank
        sent here, ``recv[r]`` of them from rank ``r``, in rank order (``send`` / ``recv``: one count per rank,
        each rank's ``recv[r]`` equal to rank ``r``'s ``send[self.rank]``; zero counts allowed)."""
        if self.size == 1:
            return x
        import torch.distributed as dist

        out = x.new_empty((sum(recv), *x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), recv, send, group=self.group)
        return out


#: The unsharded model's collectives: every call is the identity.
SINGLE_RANK = Comm()
