"""MoE dispatch and combine across attention replicas: only the routed rows move between ranks.

Under data-parallel attention every replica runs its own tokens, while the routed experts are split over
all ``D x T`` ranks of the group (the *expert group*). Routing is computed where the tokens are: the
router (``Gate``: score weights, bias, hash table ``tid2eid``) is replicated, so hash-routed and
score-routed layers alike decide locally and only the rows travel. One MoE layer is then, on every rank:

1. **counts**: for each peer, how many of this rank's rows need it (expert parallel: the rows with at
   least one chosen expert in the peer's partition; tensor-parallel experts: every row, since every rank
   holds a slice of every expert), counted on the device; one ``all_to_all_single`` of these ``[world]``
   int64 counts tells each rank how many rows it receives from each peer, and both count vectors come back
   to the host in one read (``all_to_all_single`` takes its split sizes as host integers);
2. **dispatch**: one ``all_to_all_single`` of the rows (``[rows, dim]`` in the model's dtype) and one of
   their routing (``[rows, 2k]`` fp32: the k weights, then the k expert ids, exact in fp32);
3. **experts**: the caller's ``expert_fn`` over the received rows: each row's sum over the experts this
   rank holds (whole experts, or its slice of each), fp32;
4. **combine**: one ``all_to_all_single`` sends each partial back to the rank the row came from, which
   adds the partials of a row in rank order.

Inside a replica of ``T > 1`` ranks the ``T`` ranks hold the same tokens; rank ``j`` of the replica sends
rows ``j, j + T, ...`` only, so no row is computed twice, and :meth:`ExpertExchange.run_experts` returns
zero for the rows a sibling sent: the replica's all-reduce that already follows the MoE (it sums the
shared expert's slices) completes every row.

A rank with no tokens (a replica running a padding step, or a replica rank with fewer rows than
siblings) still takes part with zero counts; every rank makes the same four collectives per layer.

The counts are read back to the host once per layer (the split sizes of the row exchange: the layer's
only read; the rows for each peer are ordered by a fixed-size sort on the device, not a ``nonzero``), so
a layer that exchanges rows cannot be recorded in a CUDA graph. Under expert parallelism the counts
change with every layer's routing, so no read can be shared between layers; a fixed-capacity
all-to-all removes the read. On a GPU build the same contract (:meth:`run_experts`: rows,
weights, ids in; this rank's routed sum out) is where a fused all-to-all plugs in: DeepEP's
dispatch / combine (normal mode for prefill, low-latency mode for decode, whose fixed-size buffers
also remove the host read), mori's EP dispatch / combine, or aiter's all-to-all. ``shard_model`` builds
the exchange for each MoE layer; a GPU implementation is selected there. None is wired in yet: every
backend runs this ``torch.distributed`` version (NCCL/RCCL on GPUs, gloo on CPU).
"""

from __future__ import annotations

from typing import Callable

import torch

from atom.comm import SINGLE_RANK, Comm

__all__ = ["ExpertExchange", "ExpertFn"]

#: ``(rows [R, dim], weights [R, k] fp32, expert ids [R, k] int64) -> fp32 [R, dim]``: each row's sum over
#: the experts (or expert slices) this rank holds.
ExpertFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class ExpertExchange:
    """Dispatch/combine of one MoE layer over the expert group ``comm`` (every rank of every replica).

    ``expert_parallel``: rank ``r`` of ``comm`` holds experts ``r*E/W .. (r+1)*E/W - 1`` whole (``E`` =
    ``n_experts``, ``W`` = ``comm.size``), so a row goes only to the ranks owning its chosen experts;
    otherwise every rank holds a slice of every expert and every row goes to every rank.
    ``replica``: the ranks of this rank's attention replica (same tokens on each; ``SINGLE_RANK`` when a
    replica is one rank).
    """

    def __init__(self, comm: Comm, n_experts: int, *, expert_parallel: bool, replica: Comm = SINGLE_RANK) -> None:
        if n_experts < 1 or (expert_parallel and n_experts % comm.size):
            raise ValueError(f"{n_experts} routed experts cannot be partitioned over {comm.size} ranks; expert "
                             "parallelism needs a multiple of the group size")
        self.comm, self.replica = comm, replica
        self.n_experts, self.expert_parallel = n_experts, expert_parallel

    def destinations(self, idx: torch.Tensor) -> torch.Tensor:
        """``[rows, world]`` bool: which ranks must see each row with chosen experts ``idx [rows, k]``."""
        world = self.comm.size
        if not self.expert_parallel:
            return torch.ones(idx.shape[0], world, dtype=torch.bool, device=idx.device)
        owner = idx // (self.n_experts // world)
        return (owner[:, :, None] == torch.arange(world, device=idx.device)).any(dim=1)

    def run_experts(self, x: torch.Tensor, weights: torch.Tensor, idx: torch.Tensor, expert_fn: ExpertFn
                    ) -> torch.Tensor:
        """fp32 ``[T, dim]``: the routed sum of each of this rank's rows it dispatches (every expert of the
        row, wherever it lives), zero for the rows a sibling of its replica dispatches. Collective over the
        expert group: every rank calls it once per MoE layer, with ``T = 0`` rows if it has none."""
        mine = torch.arange(self.replica.rank, x.shape[0], self.replica.size, device=x.device)
        order, sent = self._plan(idx[mine])  # order: this rank's rows to send, grouped by peer
        send_counts, recv_counts = self._exchange_counts(sent)
        order = order[: sum(send_counts)]
        route = torch.cat([weights[mine].float(), idx[mine].float()], dim=1)[order]
        rows = self.comm.all_to_all(x[mine][order], send_counts, recv_counts)
        got = self.comm.all_to_all(route, send_counts, recv_counts)
        k = idx.shape[1]
        if rows.shape[0]:
            partial = expert_fn(rows, got[:, :k].contiguous(), got[:, k:].long())
        else:  # nothing routed here this layer (the experts' paths assume at least one row)
            partial = torch.zeros(0, x.shape[1], dtype=torch.float32, device=x.device)
        back = self.comm.all_to_all(partial.float(), recv_counts, send_counts)
        out = torch.zeros(x.shape[0], x.shape[1], dtype=torch.float32, device=x.device)
        lo = 0
        for count in send_counts:  # peers in rank order: a row's partials are added in that order
            if count:
                out[mine[order[lo:lo + count]]] += back[lo:lo + count]
            lo += count
        return out

    def _plan(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(order [world * rows], counts [world] int64)`` on the device: ``order[:counts.sum()]`` are the rows to
        send, by peer then row (a row once per peer that needs it), the rest rows no peer takes; ``counts`` the
        rows per peer. A stable sort of the ``[world, rows]`` grid puts each peer's rows first in grid order, so
        the sizes are fixed by the shapes (no ``nonzero``)."""
        dest = self.destinations(idx)
        rows = idx.shape[0]
        if rows == 0:
            return torch.zeros(0, dtype=torch.int64, device=idx.device), dest.sum(dim=0)
        skipped = (~dest.t()).reshape(-1).to(torch.int8)  # 0: a (peer, row) entry that is sent
        return torch.sort(skipped, stable=True).indices % rows, dest.sum(dim=0)

    def _exchange_counts(self, sent: torch.Tensor) -> tuple[list[int], list[int]]:
        """``(rows sent to, rows received from each peer)``: one ``all_to_all_single`` of the device counts
        ``sent [world]`` (NCCL moves device tensors only), then both vectors read back together (the layer's one
        read)."""
        world = self.comm.size
        got = self.comm.all_to_all(sent, [1] * world, [1] * world)
        both = torch.cat([sent, got]).tolist()
        return both[:world], both[world:]
