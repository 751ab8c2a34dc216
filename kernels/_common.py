"""Shared helpers of the kernel files: the guarded Triton import and the argument checks.

Kept apart from the kernels because every kernel file needs the same two things: a way to be
imported when triton is missing (the torch references must keep working on a bare CPU install),
and the checks its wrapper runs before a launch. Triton's interpreter does not catch
out-of-bounds accesses and ``tl.device_assert`` is a no-op there, so every bound a kernel relies
on is checked here, in Python, and reported as ``ValueError`` naming the argument.
"""

from __future__ import annotations

import contextlib
from typing import Iterable, Iterator

import torch

from .tiles import tiles_for

try:  # triton is optional: the torch references must work without it.
    import triton
    import triton.language as tl

    HAS_TRITON = True
except ImportError:  # pragma: no cover - exercised only on installs without triton
    triton = None
    tl = None
    HAS_TRITON = False


# dtypes of the activations (queries, weights, rows to write) a kernel takes. float64 is the CPU
# verification mode (``ModelConfig.dtype``): only the torch references run it; the engine refuses it on a GPU.
VALUE_DTYPES = (torch.float32, torch.bfloat16, torch.float64)

# dtypes a row view may have: kernels only copy or read rows, uint8/fp8 rows are raw bytes.
ROW_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.uint8, torch.float8_e4m3fn)


def require_triton(name: str) -> None:
    """Raise a clear error when a Triton wrapper is called on an install without triton."""
    if not HAS_TRITON:
        raise RuntimeError(f"{name}: triton is not installed; use the torch reference ({name}_ref) "
                           "or install the 'kernels' extra")


def next_pow2(n: int) -> int:
    """Smallest power of two >= max(n, 1)."""
    return 1 << max(int(n) - 1, 0).bit_length()


def check_positive(name: str, value: int, minimum: int = 1) -> None:
    if not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")


def check_power_of_two(name: str, what: str, value: int) -> None:
    """``value`` (the ``what`` of a ``name`` launch) is a power of two: it sizes a ``tl.arange``, which takes
    only powers of two."""
    if value < 1 or value & (value - 1):
        raise ValueError(f"{name} needs {what} a power of two, got {value}")


def check_rows(name: str, t: torch.Tensor, *, ndim: int = 2, dtypes: Iterable[torch.dtype] = ROW_DTYPES,
               width: int | None = None, dtype: torch.dtype | None = None) -> None:
    """A row view: ``ndim`` dims, innermost dim contiguous (outer strides arbitrary), allowed dtype.

    Runs on every kernel call of every layer, so the passing path reads each property once and builds nothing.
    """
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dims, got shape {tuple(t.shape)}")
    if dtype is not None:
        dtypes = (dtype,)
    elif not isinstance(dtypes, tuple):
        dtypes = tuple(dtypes)
    if t.dtype not in dtypes:
        raise ValueError(f"{name} has dtype {t.dtype}; expected one of {', '.join(map(str, dtypes))}")
    stride = t.stride()
    if ndim and t.shape[-1] > 1 and stride[-1] != 1:
        raise ValueError(f"{name} must have a contiguous inner dim (stride(-1) == 1), got strides {stride}")
    if ndim and min(stride) < 0:
        raise ValueError(f"{name} has a negative stride {stride}")
    if width is not None and t.shape[-1] != width:
        raise ValueError(f"{name} has inner width {t.shape[-1]}, expected {width}")


def check_index(name: str, t: torch.Tensor, shape: tuple[int | None, ...]) -> None:
    """An index tensor: int32, contiguous, shape matching ``shape`` (None = any size)."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.int32:
        raise ValueError(f"{name} must be int32, got {t.dtype}")
    actual = t.shape
    if len(actual) != len(shape) or not all(e is None or e == a for e, a in zip(shape, actual)):
        want = tuple("*" if e is None else e for e in shape)
        raise ValueError(f"{name} has shape {tuple(actual)}, expected {want}")
    if not t.is_contiguous():
        raise ValueError(f"{name} must be contiguous, got strides {t.stride()}")


class _ValueChecks:
    enabled = True


@contextlib.contextmanager
def value_checks_off() -> Iterator[None]:
    """Inside the block, skip the checks that read tensor *values* (ranges, causality, finiteness).

    Each such check costs a device sync, which a CUDA-graph capture cannot contain and which would
    dominate a benchmark. Shapes, dtypes and layouts are still checked. Use it only for inputs that
    were validated once outside the block. Does not nest; not thread-safe (one host thread launches).
    """
    if not _ValueChecks.enabled:
        raise RuntimeError("value_checks_off() does not nest")
    _ValueChecks.enabled = False
    try:
        yield
    finally:
        _ValueChecks.enabled = True


def value_checks_enabled() -> bool:
    return _ValueChecks.enabled


def check_range(name: str, t: torch.Tensor, lo: int, hi: int, what: str = "") -> None:
    """Every value of ``t`` lies in [lo, hi). Costs one device sync on a GPU (skipped under value_checks_off)."""
    if t.numel() == 0 or not _ValueChecks.enabled:
        return
    tmin, tmax = torch.stack(torch.aminmax(t)).tolist()  # one device sync
    if tmin < lo or tmax >= hi:
        extra = f" ({what})" if what else ""
        raise ValueError(f"{name} holds values in [{tmin}, {tmax}], outside the valid range [{lo}, {hi}){extra}")


def masked_put(dst: torch.Tensor, index: tuple[torch.Tensor, ...], values: torch.Tensor, keep: torch.Tensor) -> None:
    """``dst[index] = values`` for the entries where ``keep`` is true, without reading ``keep`` back to the host.

    ``index``: 1-D index tensors ``[N]`` (one per leading dim of ``dst``); ``values``: ``[N, ...]``. A skipped
    entry (whatever its index, -1 included) is turned into a copy of a kept write (same index, same value),
    or, when nothing is kept, into writing element 0 back onto itself; ``index_put_`` with duplicate indices
    carrying equal values gives that value on every device. Kept entries must not share an index.
    Used by the torch references so that a step never syncs (boolean-mask selection would).
    """
    masked_puts(((dst, values),), index, keep)


def masked_puts(writes: Iterable[tuple[torch.Tensor, torch.Tensor]], index: tuple[torch.Tensor, ...],
                keep: torch.Tensor) -> None:
    """:func:`masked_put` of each ``(dst, values)`` pair of ``writes`` at one shared ``index`` and ``keep``.

    The redirected index is built once for all of them (the references write a value and a score tensor at
    the same rows); every ``dst`` takes ``index`` over its leading dims.
    """
    put_redirected(writes, masked_redirect(index, keep))


#: what :func:`masked_redirect` returns: (the index each entry writes at, the entry whose value it writes,
#: ``[1]`` whether any entry is kept), or None for no entries
Redirect = tuple[tuple[torch.Tensor, ...], torch.Tensor, torch.Tensor] | None


def masked_redirect(index: tuple[torch.Tensor, ...], keep: torch.Tensor) -> Redirect:
    """The index half of :func:`masked_puts`, which depends on no data tensor: references whose index and
    ``keep`` are the step's compute it once per step (:mod:`.step_memo`) and pass it to :func:`put_redirected`.
    A skipped entry writes the value of a kept one at that one's index; with none kept every entry writes
    at index 0, and :func:`put_redirected` writes the value already there."""
    if keep.numel() == 0:
        return None
    any_keep, kept = keep.max(0, keepdim=True)  # [1] each: whether any entry is kept, and one kept entry (a
    # 1-d index: indexing with a 0-d tensor would read it back)
    source = torch.where(keep, torch.arange(keep.shape[0], device=keep.device), kept)  # the entry each writes
    return tuple(i[source] * any_keep for i in index), source, any_keep


def put_redirected(writes: Iterable[tuple[torch.Tensor, torch.Tensor]], redirect: Redirect) -> None:
    """The data half of :func:`masked_puts`: each ``dst[index] = values`` through ``redirect``."""
    if redirect is None:
        return
    idx, source, any_keep = redirect
    origin = (0,) * len(idx)
    for dst, values in writes:
        vals = values[source]
        dst.index_put_(idx, torch.where(any_keep.reshape((1,) * vals.dim()), vals, dst[origin]))


def check_same_device(**tensors: torch.Tensor) -> None:
    devices = [t.device for t in tensors.values()]
    if devices and devices.count(devices[0]) != len(devices):
        raise ValueError(f"all tensors must be on one device, got {({n: t.device for n, t in tensors.items()})}")


def max_swa_page(num_rows: int, block_size: int, row_stride: int) -> int:
    """Number of SWA pages a row view of ``num_rows`` rows can address (pages 0 .. n-1)."""
    if num_rows < block_size:
        return 0
    return (num_rows - block_size) // row_stride + 1


def max_comp_page(num_rows: int, entries_per_block: int, pages_per_chunk: int, chunk_rows: int) -> int:
    """Number of compressed pages whose rows all lie inside a view of ``num_rows`` rows."""
    full_chunks = num_rows // chunk_rows
    rest = num_rows - full_chunks * chunk_rows
    return full_chunks * pages_per_chunk + min(rest // entries_per_block, pages_per_chunk)


def compressed_row(page: torch.Tensor, slot: torch.Tensor, entries_per_block: int, pages_per_chunk: int,
                   chunk_rows: int) -> torch.Tensor:
    """Physical row of compressed ``slot`` in ``page``: (page // k) * chunk_rows + (page % k) * epb + slot."""
    page = page.long()
    return (page // pages_per_chunk) * chunk_rows + (page % pages_per_chunk) * entries_per_block + slot.long()


def check_comp_geometry(entries_per_block: int, pages_per_chunk: int, chunk_rows: int) -> None:
    check_positive("entries_per_block", entries_per_block)
    check_positive("pages_per_chunk", pages_per_chunk)
    if not isinstance(chunk_rows, int) or chunk_rows < pages_per_chunk * entries_per_block:
        raise ValueError(f"chunk_rows={chunk_rows!r} must be an int >= pages_per_chunk * entries_per_block "
                         f"= {pages_per_chunk * entries_per_block}, or pages of one chunk would overlap")


def check_swa_geometry(block_size: int, row_stride: int) -> None:
    check_positive("block_size", block_size)
    if not isinstance(row_stride, int) or row_stride < block_size:
        raise ValueError(f"row_stride={row_stride!r} must be an int >= block_size={block_size}: "
                         "an SWA page holds block_size rows of the layer")


def launch_tiles(device: torch.device, width: int) -> tuple[int, int]:
    """(rows per program, width tile) for a row-copy kernel, from the ``copy_*`` entries of
    :mod:`atom.kernels.tiles` (the interpreter takes many wide rows per program; a GPU fewer, narrower ones
    to keep registers low)."""
    t = tiles_for(device)
    return t.copy_rows, min(next_pow2(width), t.copy_width)


if HAS_TRITON:

    @triton.jit
    def copy_rows(src_ptr, src_off, dst_ptr, dst_off, ok, width, BLOCK_W: tl.constexpr):
        """Copy ``width`` elements from src_ptr+src_off[i] to dst_ptr+dst_off[i] for rows with ok[i]."""
        for w0 in range(0, width, BLOCK_W):
            w = w0 + tl.arange(0, BLOCK_W)
            m = ok[:, None] & (w[None, :] < width)
            x = tl.load(src_ptr + src_off[:, None] + w[None, :], mask=m)
            tl.store(dst_ptr + dst_off[:, None] + w[None, :], x, mask=m)

    @triton.jit
    def mma(a, b, BF16: tl.constexpr, NATIVE: tl.constexpr):
        """``a @ b`` accumulated in fp32. ``BF16``: the operands are rounded to bf16 and multiplied on the
        bf16 tensor cores (``NATIVE``), or, in the interpreter (whose bf16 ``tl.dot`` is wrong), as the same
        bf16 values in an fp32 dot: a product of two bf16 values is exact in fp32, so both give the same
        products. Without ``BF16`` (fp32 values: the CPU verification path) an fp32 IEEE dot."""
        if BF16:
            a = a.to(tl.bfloat16)
            b = b.to(tl.bfloat16)
            if NATIVE:
                return tl.dot(a, b)
            return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
        return tl.dot(a, b, input_precision="ieee")
