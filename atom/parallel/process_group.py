"""Joining the ranks: one process group for the model's collectives and a CPU one for the batch.

A rank calls :func:`join` with its rank, the group size and a rendezvous address: a
``tcp://127.0.0.1:PORT`` that ``atom serve`` picked for the workers it spawns, or ``env://`` under
``torchrun`` (which sets the rank, size and master address in the environment that
``torch.distributed`` reads). Tensors of the model go through NCCL on CUDA devices (RCCL on ROCm,
same backend name) and gloo on CPU; the scheduled batch is a Python object, broadcast through a
gloo group on every device type so it never needs a device copy.

Under data-parallel attention :func:`replica_comm` adds one subgroup per attention replica (its ``T``
ranks, same backend as the model's group): the attention, embedding and head combine over it, while
the MoE exchange and the batch broadcast span every rank.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from atom.comm import Comm

__all__ = ["RankGroup", "join", "replica_comm", "free_port", "backend_for"]

#: How long a collective may wait for a peer before it fails (a dead peer usually fails it sooner).
TIMEOUT = timedelta(minutes=10)


def backend_for(device: torch.device | str) -> str:
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class RankGroup:
    """This process's place in the group: ``comm`` for tensors, ``cpu_group`` for Python objects."""

    rank: int
    size: int
    comm: Comm
    cpu_group: object
    device: str = "cpu"  # where this rank's model lives: "cpu" or "cuda:<rank % visible GPUs>"

    def broadcast(self, obj: object) -> object:
        """Rank 0's ``obj`` on every rank (other ranks pass anything, e.g. None)."""
        box = [obj]
        dist.broadcast_object_list(box, src=0, group=self.cpu_group)
        return box[0]

    def gather(self, obj: object) -> list[object] | None:
        """Every rank's ``obj`` in rank order on rank 0; None elsewhere."""
        out = [None] * self.size if self.rank == 0 else None
        dist.gather_object(obj, out, dst=0, group=self.cpu_group)
        return out

    def leave(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def join(rank: int | None, size: int | None, init_method: str, device: torch.device | str) -> RankGroup:
    """Initialise ``torch.distributed`` for this process (``rank``/``size`` None: from the launcher). On a
    GPU ``device`` (its index is ignored) rank ``k`` takes GPU ``k % visible GPUs``: with ``torchrun``'s
    contiguous ranks per node that is its local rank."""
    backend = backend_for(device)
    kwargs = {} if rank is None else {"rank": rank, "world_size": size}
    dist.init_process_group(backend, init_method=init_method, timeout=TIMEOUT, **kwargs)
    rank, size = dist.get_rank(), dist.get_world_size()
    local = "cpu"
    if backend == "nccl":  # before the first collective, which creates the NCCL communicator on this GPU
        index = rank % torch.cuda.device_count()
        torch.cuda.set_device(index)
        local = f"cuda:{index}"
    cpu_group = dist.group.WORLD if backend == "gloo" else dist.new_group(backend="gloo", timeout=TIMEOUT)
    return RankGroup(rank, size, Comm(rank, size, dist.group.WORLD), cpu_group, local)


def replica_comm(group: RankGroup, tensor_parallel_size: int) -> Comm:
    """The collectives of this rank's attention replica (ranks ``d*T .. d*T+T-1`` with ``T`` =
    ``tensor_parallel_size``). Collective: every rank of ``group`` calls it at the same point, since every
    rank takes part in creating every replica's subgroup; a replica of one rank needs none (local)."""
    t = tensor_parallel_size
    if t < 1 or group.size % t:
        raise ValueError(f"tensor_parallel_size={t} must divide the group's {group.size} ranks")
    if t == 1:
        return Comm()
    mine = None
    for first in range(0, group.size, t):
        ranks = list(range(first, first + t))
        sub = dist.new_group(ranks, timeout=TIMEOUT)
        if group.rank in ranks:
            mine = sub
    return Comm(group.rank % t, t, mine)
