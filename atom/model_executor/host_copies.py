"""The host tier's bytes, and the copies a batch orders between them and the arena.

The host buffer has the arena's geometry (:mod:`atom.kv.host_pool`): ``num_chunks`` chunks of
``layout.chunk_bytes``, pinned on a GPU machine (so copies to and from it are asynchronous DMA),
ordinary memory on the CPU. Page ``p`` of an owner therefore sits at the same offsets in both
buffers, and a copy order (:class:`~atom.step_contract.HostCopy`) moves each page's bytes between them:

- an SWA page is one contiguous span of ``swa_page_bytes`` (its rows of every layer + the fused CSA
  boundary state), page ``p`` at byte ``p * swa_page_bytes``: both buffers are viewed as
  ``[pages, swa_page_bytes]`` and moved with the kernel backend's ``copy_pages``;
- a compressed page is one span per compressed layer (its rows) and per CSA layer (its indexer keys)
  inside its chunk (layer-major): each span kind is a ``[chunks, pages_per_chunk, span_bytes]`` view,
  moved by torch indexing.

:meth:`HostCopies.run` executes a batch's orders before its forward: every store, then every load.
On the CPU that is a plain copy. On a GPU the copies run on a copy stream of their own, which first
waits for the work already queued (the previous step wrote the pages a store reads) and whose event
the compute stream waits on before the step's forward; a load is a host gather into pinned staging,
one asynchronous host-to-device copy and a scatter into the arena pages (the host returns once they
are queued; their pinned staging is kept until the next run has waited for the event), a store the
mirror image (it waits for its device-to-host copy before the host scatter). ``wait_seconds`` adds
up the host time spent issuing and waiting for copies.
"""

from __future__ import annotations

import time
from typing import Callable, NamedTuple

import torch

from atom.kernels.backend import value_checks_off
from atom.kv.kv_layout import KvLayout
from atom.kv.page_map import COMPRESS, SWA
from atom.step_contract import HostCopy

__all__ = ["HostCopies", "Span"]


class Span(NamedTuple):
    """One piece of every page of an owner: ``nbytes`` at ``offset + chunk * chunk_stride + local * page_stride``."""

    offset: int
    nbytes: int
    pages_per_chunk: int
    page_stride: int
    chunk_stride: int


def _spans(layout: KvLayout) -> dict[str, list[Span]]:
    spec, cb = layout.spec, layout.chunk_bytes
    swa = [Span(0, layout.swa_page_bytes, layout.chunk_pages, layout.swa_page_bytes, cb)]
    comp = []
    regions = [layout.compressed_rows(lay) for lay in spec.compressed_layers]
    regions += [layout.index_rows(lay) for lay in spec.csa_layers]
    for r in regions:
        comp.append(Span(r.offset, r.used_rows * r.row_bytes, r.pages_per_chunk, r.page_rows * r.row_bytes,
                         r.chunk_rows * r.row_bytes))
    assert all(s.chunk_stride == cb for s in comp), "compressed spans must repeat once per chunk"
    return {SWA: swa, COMPRESS: comp}


def _view(buf: torch.Tensor, span: Span, num_chunks: int) -> torch.Tensor:
    return torch.as_strided(buf, (num_chunks, span.pages_per_chunk, span.nbytes),
                            (span.chunk_stride, span.page_stride, 1), span.offset)


class HostCopies:
    """Host buffer of ``num_chunks`` arena chunks beside ``arena`` (the arena's byte buffer)."""

    def __init__(self, layout: KvLayout, num_chunks: int, arena: torch.Tensor,
                 copy_pages: Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], None],
                 poison: bool = False) -> None:
        """``copy_pages``: the kernel backend's page copy; ``poison``: the host buffer starts as 0xFF bytes
        (NaN in every row format, like a poisoned arena), so a load of a page no store wrote shows."""
        if num_chunks < 1:
            raise ValueError(f"a host tier needs at least one chunk, got num_chunks={num_chunks}")
        self.layout = layout
        self.device = arena.device
        self.on_gpu = self.device.type == "cuda"
        self.host = torch.full((num_chunks * layout.chunk_bytes,), 0xFF if poison else 0, dtype=torch.uint8,
                               pin_memory=self.on_gpu)
        self.arena = arena
        self.copy_pages = copy_pages
        self.spans = _spans(layout)
        self.num_chunks = {"host": num_chunks, "arena": layout.num_chunks}
        spb = layout.swa_page_bytes
        self._pages2d = {"host": self.host.view(-1, spb)[:num_chunks * layout.chunk_pages],
                         "arena": arena[:layout.arena_bytes].view(-1, spb)[:layout.max_swa_pages]}
        self.stream = torch.cuda.Stream(self.device) if self.on_gpu else None
        self.event = torch.cuda.Event() if self.on_gpu else None
        self._staging: list[torch.Tensor] = []  # pinned buffers of loads that may still be in flight
        self.wait_seconds = 0.0
        self.pages_moved = 0

    def run(self, stores: tuple[HostCopy, ...], loads: tuple[HostCopy, ...]) -> None:
        """Execute every store, then every load; on a GPU the compute stream then waits for them (the
        host returns once the loads are queued; a store waits for its device-to-host copy)."""
        if not stores and not loads:
            return
        t0 = time.perf_counter()
        with value_checks_off():  # the control plane validated the orders: no index read-back per copy
            if self.on_gpu:
                if self._staging:  # the previous loads' pinned staging is reusable once they ran
                    self.event.synchronize()
                    self._staging.clear()
                self.stream.wait_stream(torch.cuda.current_stream(self.device))
                with torch.cuda.stream(self.stream):
                    self._run_all(stores, loads)
                    self.event.record(self.stream)
                torch.cuda.current_stream(self.device).wait_event(self.event)
            else:
                self._run_all(stores, loads)
        self.wait_seconds += time.perf_counter() - t0

    def _run_all(self, stores: tuple[HostCopy, ...], loads: tuple[HostCopy, ...]) -> None:
        for order in stores:
            self._copy(order, to_host=True)
        for order in loads:
            self._copy(order, to_host=False)

    def _copy(self, order: HostCopy, to_host: bool) -> None:
        src_name, dst_name = ("arena", "host") if to_host else ("host", "arena")
        src_pages = torch.tensor(order.src_pages, dtype=torch.int64)
        dst_pages = torch.tensor(order.dst_pages, dtype=torch.int64)
        self.pages_moved += len(order.src_pages)
        if order.owner == SWA:
            self._copy_rows(self._pages2d[src_name], src_pages, self._pages2d[dst_name], dst_pages, to_host)
            return
        buffers = {"host": self.host, "arena": self.arena}
        for span in self.spans[order.owner]:
            src = _view(buffers[src_name], span, self.num_chunks[src_name])
            dst = _view(buffers[dst_name], span, self.num_chunks[dst_name])
            ppc = span.pages_per_chunk
            self._copy_spans(src, src_pages // ppc, src_pages % ppc, dst, dst_pages // ppc, dst_pages % ppc, to_host)

    def _copy_rows(self, src: torch.Tensor, src_pages: torch.Tensor, dst: torch.Tensor, dst_pages: torch.Tensor,
                   to_host: bool) -> None:
        """Whole SWA pages (2-D page tables): ``copy_pages`` on the arena's device, torch row indexing
        on the host side; through pinned staging on a GPU."""
        if not self.on_gpu:
            self.copy_pages(src, src_pages, dst, dst_pages)
            return
        n, dev = len(src_pages), self.device
        rows = torch.arange(n, dtype=torch.int64, device=dev)
        pinned = torch.empty((n, src.shape[1]), dtype=torch.uint8, pin_memory=True)
        if to_host:  # gather on the device, one D2H copy, host scatter
            staged = torch.empty((n, src.shape[1]), dtype=torch.uint8, device=dev)
            self.copy_pages(src, src_pages.to(dev), staged, rows)
            pinned.copy_(staged, non_blocking=True)
            self.stream.synchronize()
            dst.index_copy_(0, dst_pages, pinned)
        else:  # host gather into pinned staging, one H2D copy, device scatter
            torch.index_select(src, 0, src_pages, out=pinned)
            self.copy_pages(pinned.to(dev, non_blocking=True), rows, dst, dst_pages.to(dev))
            self._staging.append(pinned)  # kept until the copy ran (the next run waits for the event)

    def _copy_spans(self, src: torch.Tensor, sc: torch.Tensor, sl: torch.Tensor, dst: torch.Tensor,
                    dc: torch.Tensor, dl: torch.Tensor, to_host: bool) -> None:
        """One span of each compressed page (``[chunks, pages, bytes]`` views), by torch indexing."""
        if not self.on_gpu:
            dst[dc, dl] = src[sc, sl]
            return
        dev = self.device
        if to_host:
            pinned = torch.empty((len(sc), src.shape[2]), dtype=torch.uint8, pin_memory=True)
            pinned.copy_(src[sc.to(dev), sl.to(dev)], non_blocking=True)
            self.stream.synchronize()
            dst[dc, dl] = pinned
        else:
            pinned = src[sc, sl].pin_memory()
            dst[dc.to(dev), dl.to(dev)] = pinned.to(dev, non_blocking=True)
            self._staging.append(pinned)
