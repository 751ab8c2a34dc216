"""The table deltas the KV memory emits: how the runner's per-request page tables change.

A request's full tables are shipped once (:class:`NewTables`, when it is admitted), then only the
entries that changed (:class:`TableUpdate`, one per run of consecutive entries), so a step's size
does not grow with context length. Every entry is a physical page or -1 (no page: out of window,
never materialised). The step loop carries these in its batch (:mod:`atom.step_contract`); they are
defined here because the block manager writes them and the KV package imports nothing of the step
loop. The host tier's copy orders (:class:`HostCopy`) travel the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from atom.kv.page_map import Owner

__all__ = ["TableUpdate", "NewTables", "HostCopy"]


class TableUpdate(NamedTuple):
    """Entries ``index .. index+len(pages)-1`` of request ``seq_id``'s ``owner`` table
    (``Owner.SWA`` / ``Owner.COMPRESS``) are now ``pages`` (-1: no page). A named tuple, immutable like
    a frozen dataclass: one is built per table change on the step's path, and a frozen dataclass's
    constructor costs several times a tuple's."""

    seq_id: int
    owner: Owner
    index: int
    pages: tuple[int, ...]


class NewTables(NamedTuple):
    """The full tables of a request admitted this step (a named tuple, as :class:`TableUpdate`)."""

    seq_id: int
    comp_pages: tuple[int, ...]
    swa_pages: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class HostCopy:
    """Copy whole pages of arena owner ``owner`` (``"swa"`` / ``"compress"``): page ``src_pages[i]`` to
    page ``dst_pages[i]``. In a batch's ``host_stores`` the sources are device pages and the
    destinations host pages; in ``host_loads`` the reverse. No destination repeats within one order.
    The runner executes, before the step's forward, every store, then every load."""

    owner: Owner
    src_pages: tuple[int, ...]
    dst_pages: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.src_pages) != len(self.dst_pages):
            raise ValueError(f"HostCopy of {self.owner}: {len(self.src_pages)} source pages but "
                             f"{len(self.dst_pages)} destination pages")
