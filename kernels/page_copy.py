"""Copy scattered pages between two page tables of one device in one launch (the host tier's copy kernel).

A page is one row of a 2-D ``uint8`` view ``[pages, page_bytes]``: the pages of one arena owner, or a
staging buffer. :func:`copy_pages` copies row ``src_pages[i]`` of ``src`` to row ``dst_pages[i]`` of
``dst`` for every ``i``. The pages a request restores or writes back are scattered over the arena, so
one call moves all of them: a host -> device load is a host gather into a staging buffer (torch), one
H2D copy of that buffer, then :func:`copy_pages` scattering the staging rows to their arena pages; a
store is the mirror image (gather from the arena with :func:`copy_pages`, one D2H copy, host scatter).

Contract (checked before anything is written; ``ValueError`` naming the argument):

* ``src`` and ``dst`` are 2-D ``uint8`` with the same ``page_bytes`` (inner dim), a contiguous inner dim
  and any non-negative row stride; ``src_pages`` / ``dst_pages`` are 1-D contiguous ``int64`` of one
  length; all four tensors are on one device.
* every ``src_pages`` value lies in ``[0, src.shape[0])`` and every ``dst_pages`` value in
  ``[0, dst.shape[0])`` (no ``-1`` sentinel: a copy order names real pages);
* no destination page appears twice (two writers of one row would race on a GPU); a source page may;
* ``src`` and ``dst`` either do not overlap in memory, or are the same view and no page is both read
  and written (a copy inside one view would otherwise read rows another program is writing).

The value checks (ranges, repeats, read/write overlap) read the index tensors and so sync a GPU; inside
:func:`~atom.kernels.backend.value_checks_off` they are skipped, for copy orders the control plane has
already validated.

The Triton kernel moves the rows as the widest integer that divides ``page_bytes``, both row strides and
both base addresses (8, 4, 2 or 1 bytes), so an 8-byte-aligned arena page moves as ``int64`` words. Grid:
byte tiles of ``BLOCK_W`` words on axis 0 (on a GPU 2 KiB per page: a 4 MiB V4-Flash SWA page is 2,026
tiles of 256 words) and groups of ``BLOCK_P`` pages on axis 1 (16 on a GPU); the tiles are the row-copy
family's of :mod:`atom.kernels.tiles`, its width counted in bytes (4 per element).
"""

from __future__ import annotations

import torch

from ._common import (HAS_TRITON, check_range, check_same_device, launch_tiles, next_pow2, require_triton, triton,
                      tl, value_checks_enabled)

__all__ = ["copy_pages", "copy_pages_reference", "word_bytes"]

_WORDS = ((8, torch.int64), (4, torch.int32), (2, torch.int16), (1, torch.uint8))


# ----------------------------------------------------------------------------------------------
# checks
# ----------------------------------------------------------------------------------------------

def _check_kind(name: str, t: torch.Tensor, dtype: torch.dtype, dims: tuple[str, ...], holds: str) -> None:
    """``t`` is a tensor of ``dtype`` with one dim per name in ``dims``; ``holds`` (what its values are) and
    ``dims`` go into the messages."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != dtype:
        raise ValueError(f"{name} must be {str(dtype).removeprefix('torch.')} ({holds}), got {t.dtype}")
    if t.dim() != len(dims):
        raise ValueError(f"{name} must be {len(dims)}-D [{', '.join(dims)}], got shape {tuple(t.shape)}")


def _check_table(name: str, t: torch.Tensor) -> None:
    _check_kind(name, t, torch.uint8, ("pages", "page_bytes"), "a byte view of the pages")
    if t.shape[1] > 1 and t.stride(1) != 1:
        raise ValueError(f"{name} must have a contiguous inner dim (stride(1) == 1), got strides {t.stride()}")
    if t.stride(0) < 0:
        raise ValueError(f"{name} has a negative row stride {t.stride()}")


def _check_pages(name: str, t: torch.Tensor) -> None:
    _check_kind(name, t, torch.int64, ("pages",), "page numbers")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous, got strides {t.stride()}")


def _extent(t: torch.Tensor) -> tuple[int, int]:
    """[first byte, one past the last byte) that ``t`` can touch."""
    if t.numel() == 0:
        return t.data_ptr(), t.data_ptr()
    return t.data_ptr(), t.data_ptr() + (t.shape[0] - 1) * t.stride(0) + t.shape[1]


def _check_repeats(name: str, pages: torch.Tensor) -> None:
    if pages.numel() < 2 or not value_checks_enabled():
        return
    ordered = torch.sort(pages).values
    same = ordered[1:] == ordered[:-1]
    if bool(same.any()):  # one device sync
        page = int(ordered[1:][same][0])
        raise ValueError(f"{name} names page {page} more than once; each destination page may be written once "
                         "per call")


def _check_overlap(src: torch.Tensor, src_pages: torch.Tensor, dst: torch.Tensor, dst_pages: torch.Tensor) -> None:
    (s0, s1), (d0, d1) = _extent(src), _extent(dst)
    if s1 <= d0 or d1 <= s0:
        return
    same_view = s0 == d0 and src.stride(0) == dst.stride(0) and src.shape == dst.shape
    if not same_view:
        raise ValueError("src and dst overlap in memory but are not the same view; pass separate buffers or one "
                         "view as both")
    if value_checks_enabled() and src_pages.numel() and dst_pages.numel():
        both = torch.isin(dst_pages, src_pages)
        if bool(both.any()):  # one device sync
            raise ValueError(f"dst_pages writes page {int(dst_pages[both][0])} that src_pages reads in the same "
                             "view; a copy inside one view must read and write disjoint pages")


def _check(src: torch.Tensor, src_pages: torch.Tensor, dst: torch.Tensor, dst_pages: torch.Tensor) -> None:
    _check_table("src", src)
    _check_table("dst", dst)
    _check_pages("src_pages", src_pages)
    _check_pages("dst_pages", dst_pages)
    if src.shape[1] != dst.shape[1]:
        raise ValueError(f"src pages are {src.shape[1]} bytes but dst pages are {dst.shape[1]}; they must be equal")
    if src_pages.shape != dst_pages.shape:
        raise ValueError(f"src_pages has {src_pages.numel()} entries but dst_pages {dst_pages.numel()}; "
                         "one source page per destination page")
    check_same_device(src=src, src_pages=src_pages, dst=dst, dst_pages=dst_pages)
    check_range("src_pages", src_pages, 0, src.shape[0], f"src has {src.shape[0]} pages")
    check_range("dst_pages", dst_pages, 0, dst.shape[0], f"dst has {dst.shape[0]} pages")
    _check_repeats("dst_pages", dst_pages)
    _check_overlap(src, src_pages, dst, dst_pages)


def word_bytes(src: torch.Tensor, dst: torch.Tensor) -> int:
    """The widest word (8, 4, 2 or 1 bytes) dividing the page size, both row strides and both base addresses."""
    for size, _ in _WORDS:
        if all(v % size == 0 for v in (src.shape[1], src.stride(0), dst.stride(0), src.data_ptr(), dst.data_ptr())):
            return size
    return 1


def _as_words(t: torch.Tensor, size: int) -> torch.Tensor:
    dtype = dict(_WORDS)[size]
    if size == 1:
        return t
    return t.view(dtype)  # inner dim contiguous and every stride / offset divisible: a pure view


# ----------------------------------------------------------------------------------------------
# torch reference
# ----------------------------------------------------------------------------------------------

def copy_pages_reference(src: torch.Tensor, src_pages: torch.Tensor, dst: torch.Tensor,
                         dst_pages: torch.Tensor) -> None:
    """Torch reference of :func:`copy_pages` (same contract): a gather, then a scatter, of the pages."""
    _check(src, src_pages, dst, dst_pages)
    if src_pages.numel() == 0 or src.shape[1] == 0:
        return
    dst.index_copy_(0, dst_pages, src.index_select(0, src_pages))



# ----------------------------------------------------------------------------------------------
# Triton
# ----------------------------------------------------------------------------------------------

if HAS_TRITON:

    @triton.jit
    def _copy_pages_kernel(src_ptr, src_pages_ptr, dst_ptr, dst_pages_ptr, num_pages, width, src_stride,
                           dst_stride, BLOCK_P: tl.constexpr, BLOCK_W: tl.constexpr):
        """Program (w, p): words ``w*BLOCK_W ..`` of copies ``p*BLOCK_P ..``; offsets in int64."""
        i = tl.program_id(1).to(tl.int64) * BLOCK_P + tl.arange(0, BLOCK_P)
        w = tl.program_id(0).to(tl.int64) * BLOCK_W + tl.arange(0, BLOCK_W)
        ok = i < num_pages
        s = tl.load(src_pages_ptr + i, mask=ok, other=0)
        d = tl.load(dst_pages_ptr + i, mask=ok, other=0)
        m = ok[:, None] & (w[None, :] < width)
        x = tl.load(src_ptr + s[:, None] * src_stride + w[None, :], mask=m)
        tl.store(dst_ptr + d[:, None] * dst_stride + w[None, :], x, mask=m)


def _tiles(device: torch.device, words: int, size: int) -> tuple[int, int]:
    """(pages per program, words per program): the row-copy family's tile, whose width counts 4-byte
    elements, turned into the same bytes of ``size``-byte words (a program moves the same bytes whatever the
    word; on sm90 an int64 tile of the element width would hold twice the registers)."""
    rows, width4 = launch_tiles(device, -(-words * size // 4))
    return rows, min(next_pow2(words), max(1, width4 * 4 // size))


def copy_pages(src: torch.Tensor, src_pages: torch.Tensor, dst: torch.Tensor, dst_pages: torch.Tensor) -> None:
    """Copy page ``src_pages[i]`` of ``src`` to page ``dst_pages[i]`` of ``dst`` for every ``i``, in one launch.

    Args:
        src, dst: ``uint8 [pages, page_bytes]`` byte views of the pages (inner dim contiguous, any row stride),
            same ``page_bytes``.
        src_pages, dst_pages: ``int64 [n]`` page numbers; ``dst_pages`` without repeats.

    Raises ValueError before launch on a wrong dtype, shape, layout, device, or (outside ``value_checks_off``)
    an out-of-range or repeated page, or a page both read and written in one view.
    """
    _check(src, src_pages, dst, dst_pages)
    require_triton("copy_pages")
    n, page_bytes = src_pages.numel(), src.shape[1]
    if n == 0 or page_bytes == 0:
        return
    size = word_bytes(src, dst)
    s, d = _as_words(src, size), _as_words(dst, size)
    rows, bw = _tiles(src.device, s.shape[1], size)
    grid = (triton.cdiv(s.shape[1], bw), triton.cdiv(n, rows))
    _copy_pages_kernel[grid](s, src_pages, d, dst_pages, n, s.shape[1], s.stride(0), d.stride(0),
                             BLOCK_P=rows, BLOCK_W=bw)
