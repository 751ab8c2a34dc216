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
a layer running this counted exchange cannot be recorded in a CUDA graph. Under expert parallelism the
counts change with every layer's routing, so no read can be shared between layers; the fixed-capacity
exchange below removes the read. On a GPU build the same contract (:meth:`run_experts`: rows,
weights, ids in; this rank's routed sum out) is where a fused all-to-all plugs in: DeepEP's
dispatch / combine (normal mode for prefill, low-latency mode for decode, whose fixed-size buffers
also remove the host read), mori's EP dispatch / combine, or aiter's all-to-all. ``shard_model`` builds
the exchange for each MoE layer; a GPU implementation is selected there. None is wired in yet: every
backend runs this ``torch.distributed`` version (NCCL/RCCL on GPUs, gloo on CPU).

**Fixed capacity** (:attr:`ExpertExchange.capacity` > 0, set for a step by
:func:`set_exchange_capacity`): the same contract without the counts' read, so the layer can be recorded
in a CUDA graph. Every rank sends every peer exactly ``capacity`` rows, whatever the routing:

1. **slots**: for each peer, a stable sort of this rank's ``[rows]`` "needed by the peer" flags puts the
   rows it needs first, in row order (the counted exchange's order); slots past the peer's count hold a
   zero row with routing weight 0 and an expert id the peer does not compute (expert parallel: the first
   expert of the next peer's partition, which the receiver skips; tensor-parallel experts, where every
   rank holds every expert: expert 0, whose zero row at weight 0 adds exactly zero);
2. **dispatch**: one ``all_to_all_single`` of ``[world * capacity, dim]`` rows and one of their
   ``[world * capacity, 2k]`` routing, equal splits: the shapes depend only on ``capacity``;
3. **experts**: ``expert_fn`` over all ``world * capacity`` received rows (padding rows included; they
   contribute nothing to any row);
4. **combine**: one ``all_to_all_single`` of the ``[world * capacity, dim]`` partials; the sender alone
   knows which of its slots were real and adds those (one ``index_add_`` per peer in rank order, the
   padding slots landing on a scratch row that is dropped), so no count travels at all.

``capacity`` must be at least the rows any rank dispatches in the step (``ceil(T_rows / T)`` for a
replica of ``T`` ranks running ``T_rows`` rows): a row goes to a peer at most once, so no peer can need
more slots than the sender has rows, whatever the routing (the DeepEP low-latency buffers count
``tokens x top-k`` because they are laid out per expert; these are per peer). A step over the capacity is
refused with an error before any collective. The value must be the same on every rank of the group (the
equal splits assume it): the data-parallel runner derives it from the runner's largest decode bucket
(:func:`decode_capacity`), identical on every rank.

Trade-off: the fixed exchange moves ``world x capacity`` rows each way per layer, every row slot padded,
where the counted one moves only the rows needed (under expert parallelism with top-k ``k`` a row needs
at most ``min(k, world)`` peers). That is cheap for a decode step, whose capacity is a few hundred rows
at most and whose launch and sync costs dominate, and it buys a step with no host read and shapes fixed
by the bucket (the precondition of graph capture). A prefill chunk of thousands of rows keeps the
counted exchange: its padded buffers would cost ``world``-fold bandwidth and expert compute, and an
eager step pays one read per layer at no loss. The runner selects the mode for the whole group per step
(:mod:`atom.parallel.dp_runner`), since every rank must make the same collectives.

The results equal the counted exchange's: the same partials, added in the same rank order. The expert
function sees a different batch (padding rows, another row count), so they are bit-identical where its
per-row result does not depend on the batch size (the tests compare both exchanges on the CPU).
"""

from __future__ import annotations

from typing import Callable

import torch

from atom.comm import SINGLE_RANK, Comm

__all__ = ["ExpertExchange", "ExpertFn", "set_exchange_capacity", "decode_capacity"]

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
        #: rows sent to every peer by the fixed-capacity exchange; 0: the counted exchange (module docstring)
        self.capacity = 0

    def set_capacity(self, rows: int) -> None:
        """Run the fixed-capacity exchange with ``rows`` slots per peer (``rows`` > 0), or the counted one
        (0). Every rank of the group must set the same value before the same layer call."""
        if isinstance(rows, bool) or not isinstance(rows, int) or rows < 0:
            raise ValueError(f"capacity={rows!r}: accepted: 0 (counted exchange) or a positive number of rows "
                             "per peer (fixed-capacity exchange)")
        self.capacity = rows

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
        expert group: every rank calls it once per MoE layer, with ``T = 0`` rows if it has none. With
        :attr:`capacity` set, the fixed-capacity exchange (no host read; shapes set by ``capacity``)."""
        if self.capacity:
            return self._run_fixed(x, weights, idx, expert_fn)
        mine = self._mine(x.shape[0], x.device)
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

    def _mine(self, rows: int, device: torch.device) -> torch.Tensor:
        """The rows of a ``rows``-row step this rank dispatches: ``j, j + T, ...`` for rank ``j`` of a replica of
        ``T`` ranks (none when ``rows <= j``)."""
        j = self.replica.rank
        return torch.arange(j, max(rows, j), self.replica.size, device=device)

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

    def _run_fixed(self, x: torch.Tensor, weights: torch.Tensor, idx: torch.Tensor, expert_fn: ExpertFn
                   ) -> torch.Tensor:
        """:meth:`run_experts` through ``capacity`` slots per peer (module docstring): three equal-split
        all-to-alls, no value read back, every shape fixed by ``capacity`` and ``x``'s."""
        world, cap, (n, dim), k = self.comm.size, self.capacity, x.shape, idx.shape[1]
        mine = self._mine(n, x.device)
        if mine.shape[0] > cap:
            raise ValueError(f"the fixed-capacity expert exchange holds {cap} rows per peer; this rank dispatches "
                             f"{mine.shape[0]} of a {n}-row step (a step over the capacity needs the counted "
                             "exchange: capacity 0)")
        slots, valid = self.fixed_slots(idx[mine])
        zero_row = x.new_zeros(1, dim)
        rows = torch.cat([x[mine], zero_row])[slots].view(world * cap, dim)
        w = torch.cat([weights[mine].float(), weights.new_zeros(1, k, dtype=torch.float32)])[slots]
        ids = torch.where(valid[:, :, None], torch.cat([idx[mine], idx.new_zeros(1, k)])[slots],
                          self._idle_experts(x.device)[:, None, None])
        route = torch.cat([w, ids.float()], dim=2).view(world * cap, 2 * k)
        split = [cap] * world
        got_rows = self.comm.all_to_all(rows, split, split)
        got = self.comm.all_to_all(route, split, split)
        partial = expert_fn(got_rows, got[:, :k].contiguous(), got[:, k:].long())
        back = self.comm.all_to_all(partial.float(), split, split).view(world, cap, dim)
        target = torch.where(valid, torch.cat([mine, mine.new_full((1,), n)])[slots], n)  # n: the scratch row
        out = torch.zeros(n + 1, dim, dtype=torch.float32, device=x.device)
        for peer in range(world):  # rank order, as the counted exchange adds a row's partials
            out.index_add_(0, target[peer], back[peer])
        return out[:n]

    def fixed_slots(self, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(slots [world, capacity] int64, valid [world, capacity] bool)`` for this rank's rows with chosen
        experts ``idx [rows, k]`` (``rows <= capacity``): slot ``j`` of peer ``p`` holds row ``slots[p, j]``
        when ``valid[p, j]`` (the rows ``p`` needs, in row order, first), else ``rows`` (a zero row). A stable
        sort of each peer's flags: fixed shapes, nothing read back."""
        rows, cap = idx.shape[0], self.capacity
        need = self.destinations(idx).t()  # [world, rows]
        order = torch.sort((~need).to(torch.int8), dim=1, stable=True).indices
        order = torch.cat([order, order.new_full((self.comm.size, cap - rows), rows)], dim=1)
        valid = torch.arange(cap, device=idx.device)[None, :] < need.sum(dim=1, keepdim=True)
        return torch.where(valid, order, rows), valid

    def _idle_experts(self, device: torch.device) -> torch.Tensor:
        """``[world]`` int64: the expert id of each peer's padding slots, one that adds nothing there (expert
        parallel: the first expert of the next peer's partition, not held by the peer; tensor-parallel
        experts: expert 0, computed on a zero row at weight 0)."""
        world = self.comm.size
        if not self.expert_parallel:
            return torch.zeros(world, dtype=torch.int64, device=device)
        return (torch.arange(1, world + 1, device=device) % world) * (self.n_experts // world)


def set_exchange_capacity(model: torch.nn.Module, rows: int) -> int:
    """Set :attr:`ExpertExchange.capacity` of every MoE layer's exchange in ``model`` to ``rows`` (0: the
    counted exchange); the number of exchanges set (0 when the model has none: one attention replica)."""
    exchanges = [m.exchange for m in model.modules() if isinstance(getattr(m, "exchange", None), ExpertExchange)]
    for ex in exchanges:
        ex.set_capacity(rows)
    return len(exchanges)


def decode_capacity(max_decode_rows: int, replica_size: int) -> int:
    """The fixed capacity that holds any decode step of at most ``max_decode_rows`` rows on a replica of
    ``replica_size`` ranks: the most rows one rank dispatches (rank ``j`` takes rows ``j, j + T, ...``)."""
    if max_decode_rows < 1 or replica_size < 1:
        raise ValueError(f"decode_capacity: max_decode_rows={max_decode_rows} and replica_size={replica_size} "
                         "must be >= 1")
    return -(-max_decode_rows // replica_size)
