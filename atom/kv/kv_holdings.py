"""What one request holds in the KV arena, owned and written by the block manager alone.

``Sequence`` keeps tokens and progress; everything the arena lends a request lives here::

    comp   blocks / pages   one compressed block per B positions, held to the end
    swa    blocks / pages   -1 before the window (released), blocks for the window and the step;
                            SCRATCH (-2) with a page: a block the step writes that leaves the window
                            at its end and is not kept, backed by a page without a logical id
    state_slot              the request's compressor-state page (a page of the ``state`` owner), -1 = none
    restore_page            SWA page whose CSA boundary state seeds that page (prefix hit), or -1
    quiet_until             computed tokens below which after_step has nothing to publish or release
    backed_from, backed_to  the positions of the block of the last position the latest growth backed
                            (all tables hold it); 0, 0 before any growth
    published_upto          blocks 0 .. published_upto-1 are published (or private duplicates)
    tip                     the prefix node of the last published block (keeps the chain alive), or -1

Every table entry changes through :meth:`KvHoldings.write`, the one place a
:class:`~atom.kv.tables.TableUpdate` is emitted: one delta per run of consecutive entries,
and only once the runner has the full tables (``shipped``).
"""

from __future__ import annotations

from atom.kv.tables import TableUpdate
from atom.kv.page_map import COMPRESS, Owner
from atom.kv.prefix_index import NO_NODE

__all__ = ["BlockTable", "KvHoldings", "SCRATCH"]

# An SWA table entry backed for one step only: its page was lent without a logical id (it is never
# published, and goes back to the arena when the block leaves the window after the step)
SCRATCH = -2

# builds a TableUpdate from its fields in one C call: the named tuple's own constructor is a Python
# function (a frame per table change); the fields are in declaration order, so nothing is checked away
_new_update = tuple.__new__


class BlockTable:
    """Logical block ids and their physical pages, index by index (-1 = none)."""

    __slots__ = ("blocks", "pages")

    def __init__(self) -> None:
        self.blocks: list[int] = []
        self.pages: list[int] = []

    def __len__(self) -> int:
        return len(self.blocks)


class KvHoldings:
    """One request's blocks, pages, state page and published chain."""

    __slots__ = ("seq_id", "comp", "swa", "swa_released_upto", "published_upto", "hit_blocks",
                 "retain_boundaries", "state_slot", "state_fresh", "restore_page", "tip", "shipped", "quiet_until",
                 "backed_from", "backed_to", "_sink")

    def __init__(self, seq_id: int, sink: list[TableUpdate]) -> None:
        self.seq_id = seq_id
        self.comp = BlockTable()
        self.swa = BlockTable()
        self.swa_released_upto = 0  # SWA blocks before it were released (left the window)
        self.published_upto = 0
        self.hit_blocks = 0  # blocks reused from the cache at admission
        self.retain_boundaries: tuple[int, ...] = ()  # boundaries whose SWA window outlives the window
        self.state_slot = -1
        self.state_fresh = False  # admitted this step: the runner clears the state page first
        self.restore_page = -1
        self.tip = NO_NODE  # (a prefix node id)
        self.shipped = False  # the runner has the full tables: later changes go as deltas
        # after_step has nothing to do while fewer tokens than this are computed (no block filled, none
        # left the window; set by after_step; 0: its next call does the full work)
        self.quiet_until = 0
        # the positions of the block that held the last position the latest growth backed: every
        # table has it (nothing takes the current block away from a running request), so a step
        # inside it needs no page (kept as positions: the test is two comparisons, no division)
        self.backed_from = 0
        self.backed_to = 0
        self._sink = sink

    def table(self, owner: Owner) -> BlockTable:
        return self.comp if owner is COMPRESS else self.swa

    def write(self, owner: Owner, index: int, blocks: list[int], pages: list[int]) -> None:
        """Entries ``index ..`` of the ``owner`` table are now ``blocks`` at ``pages`` (the table is
        padded with -1 up to ``index`` and grows past its end as needed); one delta for the run.
        A -1 pad needs no delta: the runner's table reads -1 past what it was sent."""
        table = self.comp if owner is COMPRESS else self.swa  # (the module constant: ``Owner.X`` costs 7x)
        held = len(table.blocks)
        if index > held:
            pad = [-1] * (index - held)
            table.blocks += pad
            table.pages += pad
        end = index + len(blocks)
        table.blocks[index:end] = blocks
        table.pages[index:end] = pages
        if self.shipped:
            self._sink.append(_new_update(TableUpdate, (self.seq_id, owner, index, tuple(pages))))
