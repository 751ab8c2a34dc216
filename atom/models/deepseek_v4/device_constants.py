"""Constant tensors (RoPE frequencies, FP4 code tables, Hadamard matrices) copied to a device once.

The constants are built on the host when a model is built (on the ``meta`` device while a checkpoint is
planned, so they cannot be buffers filled by the loader). A forward on a GPU that moved them on every
call would make one blocking host-to-device copy per use: a stream sync, and forbidden inside CUDA-graph
capture. :func:`on_device` keeps one device copy per (host tensor, device), made on first use (a warm-up
step or the first step, never inside a captured one); on the host tensor's own device it returns the
tensor itself. Values are unchanged, so the numerics are those of the host tensor.
"""

from __future__ import annotations

import threading

import torch

__all__ = ["on_device"]

# (id of the host tensor, device) -> (the host tensor, held so its id stays unique; its copy on the device)
_COPIES: dict[tuple[int, torch.device], tuple[torch.Tensor, torch.Tensor]] = {}
_LOCK = threading.Lock()


def on_device(host: torch.Tensor, device: torch.device | str) -> torch.Tensor:
    """``host`` on ``device``: the tensor itself when already there, else its one cached copy. ``host`` must
    never be changed in place (the copy would not follow)."""
    device = torch.device(device)
    if host.device == device:
        return host
    key = (id(host), device)
    hit = _COPIES.get(key)
    if hit is None or hit[0] is not host:
        with _LOCK:
            hit = _COPIES[key] = (host, host.to(device))
    return hit[1]
