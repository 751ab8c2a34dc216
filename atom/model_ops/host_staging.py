"""One host-to-device copy for all of a step's integer inputs.

The runner builds a step's inputs on the host (token ids, positions, table rows, entry lists, ...). A
``torch.tensor(values, device="cuda")`` per field is a blocking copy from pageable memory each: a stream
sync, and forbidden inside CUDA-graph capture. :func:`stage` packs every field into one int64 host buffer,
pinned when the target is a CUDA device, copies it with one non-blocking transfer (ordered on the stream
before any kernel that reads it; the caching host allocator keeps the pinned block until the copy is
done) and returns each field as a slice of the device copy. On the CPU the slices are views of the host
buffer itself: no copy at all.
"""

from __future__ import annotations

import torch

__all__ = ["stage"]


def stage(fields: list[list[int]], device: str | torch.device) -> list[torch.Tensor]:
    """``fields`` as int64 tensors on ``device`` (one 1-D tensor per list, in order), moved by one copy."""
    device = torch.device(device)
    sizes = [len(f) for f in fields]
    flat = [v for f in fields for v in f]
    host = torch.tensor(flat, dtype=torch.long)
    if device.type == "cuda":
        pinned = torch.empty(host.shape, dtype=torch.long, pin_memory=True)
        pinned.copy_(host)
        host = pinned.to(device, non_blocking=True)
    elif device.type != "cpu":
        host = host.to(device)
    return list(host.split(sizes))
