"""A symbolic model of what the KV arena holds, to prove the scheduler's tables are right.

Instead of tensors, every row records a *content key*: a hash of the token prefix that produced it
(``key(p) = hash(key(p-1), token[p])``), so a row written by any request for the same prefix holds
the same key, and a stale or foreign row holds a different one. Each step, the model

- checks every row the step's first query reads (its SWA window, the compressed blocks before it,
  the compressor state it resumes from) holds the key a cold run of this request would have written;
- then writes the step's rows (SWA rows, compressed rows, the ring state, CSA captures).

A speculative step's draft rows are written with keys of the drafts, so a rejected draft's row that
a later query read before it was overwritten would show as stale.

The host tier's copy orders (``batch.host_stores``, then ``batch.host_loads``) move a page's keys
between the device and a host mirror of the same three maps before the step's reads, as the runner
moves the bytes: a restored row that is not what a cold run wrote fails the next read of it.

Reads of unwritten memory show as ``None`` keys. This is what the paged engine's NaN-poisoned
bit-exactness test proves with real numbers; here it runs in microseconds on any workload.

A spec without compressed layers has no compressed pages (its tables hold -1): the model then
checks and writes no compressed rows. With compressed layers, a read or write through a -1 entry is
an error of its own (the block has no page), never a lookup of a page numbered -1.
"""

from __future__ import annotations

from typing import Callable

from atom.config import Dsv4KvSpec
from atom.step_contract import HostCopy, ScheduledBatch, ScheduledSeq
from atom.kv.page_map import COMPRESS, SWA

__all__ = ["KvContentModel", "KvContentError"]


class KvContentError(AssertionError):
    """A step would read a row that does not hold what a cold run computed."""


def _chain(prev: int, token: int) -> int:
    return hash((prev, token))


class KvContentModel:
    """Tracks content keys of SWA rows, compressed pages, state slots and CSA captures."""

    def __init__(self, block_size: int, window: int, needs_state: bool,
                 tokens_of: Callable[[int], list[int]], has_compressed: bool = True) -> None:
        self.block_size, self.window, self.needs_state = block_size, window, needs_state
        self.has_compressed = has_compressed
        self.tokens_of = tokens_of
        self.swa_rows: dict[tuple[int, int], int] = {}
        self.comp_rows: dict[int, int] = {}  # page -> key of the block's last position
        self.captures: dict[int, int] = {}  # SWA page -> key of the block's last position
        self.slots: dict[int, int | None] = {}  # state slot -> key of the last position it absorbed
        self.reads = 0
        # the host tier: the same maps over host pages
        self.host_swa_rows: dict[tuple[int, int], int] = {}
        self.host_comp_rows: dict[int, int] = {}
        self.host_captures: dict[int, int] = {}
        self.pages_copied = 0
        self._step_keys: dict[int, list[int]] = {}  # this step's keys per request (drafts included)

    @classmethod
    def for_spec(cls, spec: Dsv4KvSpec, tokens_of: Callable[[int], list[int]]) -> KvContentModel:
        """The model for ``spec``'s layers: compressor state with CSA layers, compressed rows with
        any compressed layer."""
        return cls(spec.block_size, spec.sliding_window, bool(spec.csa_layers), tokens_of,
                   has_compressed=bool(spec.compressed_layers))

    def keys(self, seq_id: int, upto: int) -> list[int]:
        tokens = self.tokens_of(seq_id)
        out, k = [], 0
        for t in tokens[:upto]:
            k = _chain(k, t)
            out.append(k)
        return out

    def step(self, batch: ScheduledBatch, tables: dict[int, dict[str, list[int]]]) -> None:
        self._step_keys.clear()
        for order in batch.host_stores:
            self._copy(order, to_host=True)
        for order in batch.host_loads:
            self._copy(order, to_host=False)
        for item in batch.seqs:
            keys = self.keys(item.seq_id, item.start_pos)
            k = keys[-1] if keys else 0
            for t in item.token_ids:  # the step's own tokens, drafts included (rows of the drafts hold them)
                k = _chain(k, t)
                keys.append(k)
            self._check_reads(item, keys, tables[item.seq_id])
            self._write(item, keys, tables[item.seq_id])
            self._step_keys[item.seq_id] = keys

    def accept(self, item: ScheduledSeq, accepted: int) -> None:
        """``accepted`` of the step's drafts were accepted: the compressor state advances over them
        (it advanced over the committed rows in :meth:`step`)."""
        if accepted:
            self.slots[item.state_slot] = self._step_keys[item.seq_id][item.start_pos + item.num_committed - 1 + accepted]

    def _copy(self, order: HostCopy, to_host: bool) -> None:
        """Move whole pages' keys (an unwritten row stays unwritten at the destination)."""
        if order.owner == SWA:
            maps = ((self.swa_rows, self.host_swa_rows, True), (self.captures, self.host_captures, False))
        else:
            maps = ((self.comp_rows, self.host_comp_rows, False),)
        for device, host, by_row in maps:
            src, dst = (device, host) if to_host else (host, device)
            for s_page, d_page in zip(order.src_pages, order.dst_pages):
                for slot in range(self.block_size) if by_row else (None,):
                    s_key, d_key = (s_page, slot) if by_row else s_page, (d_page, slot) if by_row else d_page
                    if s_key in src:
                        dst[d_key] = src[s_key]
                    else:
                        dst.pop(d_key, None)
        self.pages_copied += len(order.src_pages)

    # ---- reads --------------------------------------------------------------------------------
    def _expect(self, what: str, got: int | None, want: int, item: ScheduledSeq) -> None:
        self.reads += 1
        if got != want:
            state = "unwritten" if got is None else "stale or foreign"
            raise KvContentError(f"seq {item.seq_id} at {item.start_pos}: {what} is {state}")

    def _check_reads(self, item: ScheduledSeq, keys: list[int], table: dict[str, list[int]]) -> None:
        p, b = item.start_pos, self.block_size
        for q in range(max(0, p - self.window + 1), p):
            page = _entry(table[SWA], q // b)
            if page < 0:
                raise KvContentError(f"seq {item.seq_id} at {p}: window row {q} has no SWA page")
            self._expect(f"SWA row {q}", self.swa_rows.get((page, q % b)), keys[q], item)
        for j in range(p // b if self.has_compressed else 0):
            page = _entry(table[COMPRESS], j)
            if page < 0:
                raise KvContentError(f"seq {item.seq_id} at {p}: compressed block {j} has no page")
            self._expect(f"compressed block {j}", self.comp_rows.get(page), keys[(j + 1) * b - 1], item)
        if item.state_reset:
            self.slots[item.state_slot] = None
            if item.restore_page >= 0:
                self.slots[item.state_slot] = self.captures.get(item.restore_page)
        if p > 0 and self.needs_state:
            self._expect("compressor state", self.slots.get(item.state_slot), keys[p - 1], item)

    # ---- writes -------------------------------------------------------------------------------
    def _write(self, item: ScheduledSeq, keys: list[int], table: dict[str, list[int]]) -> None:
        b = self.block_size
        for q in range(item.start_pos, item.start_pos + item.num_tokens):
            page = _entry(table[SWA], q // b)
            if page < 0:
                raise KvContentError(f"seq {item.seq_id}: position {q} runs without an SWA page")
            self.swa_rows[(page, q % b)] = keys[q]
            if q % b == b - 1 and self.has_compressed:
                comp = _entry(table[COMPRESS], q // b)
                if comp < 0:
                    raise KvContentError(f"seq {item.seq_id}: position {q} completes a compressed block without a page")
                self.comp_rows[comp] = keys[q]
        self.slots[item.state_slot] = keys[item.start_pos + item.num_committed - 1]  # drafts: see accept
        end = item.start_pos + item.num_tokens
        for j in range(item.start_pos // b, end // b):  # blocks whose last position ran: the runner
            page = _entry(table[SWA], j)  # captures their CSA boundary state into its SWA table's page
            if page < 0:
                raise KvContentError(f"seq {item.seq_id}: capture destination of block {j} is unbacked")
            self.captures[page] = keys[(j + 1) * b - 1]


def _entry(table: list[int], index: int) -> int:
    return table[index] if index < len(table) else -1
