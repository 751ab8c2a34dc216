"""Reading safetensors files without a memory map: one header parse per file, tensors read in file order.

A safetensors file is an 8-byte little-endian header length, a JSON header (``name -> {dtype, shape,
data_offsets}`` plus an optional ``__metadata__``) and the tensor bytes.  :func:`read_header` parses and checks
the header once (the same rules as the ``safetensors`` library: known dtypes, offsets that match the shapes and
tile the data exactly to the end of the file) and returns the tensors in the order their bytes lie.
:class:`ShardFile` opens a file once and reads any number of its tensors with plain ``readinto`` calls into
freshly allocated tensors, so loading a shard costs one open and one pass over its bytes whatever its tensor
count, and no file page stays mapped once its tensor is read.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import TracebackType
from typing import NamedTuple

import torch

__all__ = ["CheckpointError", "TensorEntry", "ShardFile", "read_header", "TORCH_DTYPES", "ITEM_BYTES"]

MAX_HEADER_BYTES = 100_000_000  # the safetensors library's limit
TORCH_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64, "F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
    "U64": torch.uint64, "U32": torch.uint32, "U16": torch.uint16, "U8": torch.uint8, "BOOL": torch.bool,
    "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2, "F8_E8M0": torch.float8_e8m0fnu}
ITEM_BYTES: dict[str, int] = {k: torch.empty(0, dtype=v).element_size() for k, v in TORCH_DTYPES.items()}


class CheckpointError(ValueError):
    """A checkpoint is incomplete, corrupted, does not match its config or does not fit the device."""


class TensorEntry(NamedTuple):
    """Where a tensor lies (``file``, absolute byte range ``start:end``) and what its header says (a named tuple:
    a checkpoint has tens of thousands, and a tuple is the cheapest immutable record to make)."""

    file: Path
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        """Bytes of the tensor's data (``read_header`` checked that they match its shape and dtype)."""
        return self.end - self.start


def read_header(path: Path) -> list[tuple[str, TensorEntry]]:
    """Every tensor of safetensors file ``path`` in the order of its bytes; ``CheckpointError`` saying what is
    wrong when the file is truncated, its header is not valid or its offsets do not tile the data."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(8)
            if len(head) < 8:
                raise ValueError(f"the file has {size} bytes, fewer than the 8-byte header length")
            n = int.from_bytes(head, "little")
            if n > min(MAX_HEADER_BYTES, size - 8):
                raise ValueError(f"the header length {n} exceeds the file ({size} bytes) or {MAX_HEADER_BYTES}")
            header = json.loads(f.read(n))
        return _entries(path, header, 8 + n, size)
    except (OSError, ValueError) as e:  # JSON and UTF-8 errors are ValueErrors
        raise CheckpointError(f"checkpoint file {path} is unreadable or corrupted: {e}") from e


def _entries(path: Path, header: object, base: int, size: int) -> list[tuple[str, TensorEntry]]:
    if not isinstance(header, dict):
        raise ValueError("the header is not a JSON object")
    entries = [(name, _entry(path, name, info, base)) for name, info in header.items() if name != "__metadata__"]
    entries.sort(key=lambda item: (item[1].start, item[1].end))
    at = base
    for name, entry in entries:
        if entry.start != at:
            raise ValueError(f"tensor {name} starts at data byte {entry.start - base} but the previous tensor ends "
                             f"at {at - base} (overlapping tensors or a gap)")
        at = entry.end
    if at != size:
        raise ValueError(f"the tensors end at byte {at} but the file has {size} bytes (truncated or padded)")
    return entries


def _entry(path: Path, name: str, info: object, base: int) -> TensorEntry:
    try:
        dtype, shape, (begin, end) = info["dtype"], info["shape"], info["data_offsets"]  # type: ignore[index]
    except (TypeError, KeyError, ValueError):
        raise ValueError(f"the header entry of tensor {name} needs dtype, shape and data_offsets: "
                         f"{str(info)[:200]}") from None
    item = ITEM_BYTES.get(dtype) if type(dtype) is str else None
    if item is None:
        raise ValueError(f"tensor {name} has dtype {str(dtype)[:40]}; supported: {', '.join(ITEM_BYTES)}")
    needed = item
    valid = type(shape) is list and type(begin) is int and type(end) is int and begin >= 0 and end >= 0
    for d in shape if valid else ():
        if type(d) is not int or d < 0:
            valid = False
            break
        needed *= d
    if not valid:
        raise ValueError(f"tensor {name}: shape {str(shape)[:100]} and data_offsets must be non-negative integers")
    if end - begin != needed:
        raise ValueError(f"tensor {name}: data_offsets [{begin}, {end}] hold {end - begin} bytes but shape "
                         f"{tuple(shape)} of {dtype} needs {needed}")
    return TensorEntry(path, dtype, tuple(shape), base + begin, base + end)


class ShardFile:
    """One safetensors file opened once; :meth:`read` reads a tensor onto ``device`` (best in file order, so the
    reads are sequential)."""

    def __init__(self, path: Path, device: torch.device | str = "cpu") -> None:
        self.path = path
        self.device = torch.device(device)
        self._on_cpu = self.device.type == "cpu"
        self._at = 0  # where the file stands: reads in file order need no seek
        try:
            self._file = open(path, "rb", buffering=0)
        except OSError as e:
            raise CheckpointError(f"checkpoint file {path} is unreadable: {e}") from e

    def __enter__(self) -> "ShardFile":
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        self._file.close()

    def read(self, name: str, entry: TensorEntry) -> torch.Tensor:
        """Tensor ``name`` (at ``entry``, a header entry of this file) read into a fresh CPU buffer and moved to
        the device. Per-tensor work is kept to the few calls it needs (a checkpoint may hold tens of thousands
        of tensors of a few KiB, where they, not the bytes, are the cost)."""
        n = entry.nbytes
        raw = torch.empty(n, dtype=torch.uint8)
        try:
            if self._at != entry.start:
                self._file.seek(entry.start)
            self._at = -1  # unknown until the read completes
            buf, done = raw.numpy(), 0
            while done < n:  # one read returns at most about 2 GiB
                got = self._file.readinto(buf if done == 0 else memoryview(buf)[done:])
                if not got:
                    raise OSError(f"the file ends {n - done} bytes before the tensor's end")
                done += got
            self._at = entry.end
        except OSError as e:
            raise CheckpointError(f"tensor {name} in {self.path} is unreadable: {e}") from e
        tensor = (raw if entry.dtype == "U8" else raw.view(TORCH_DTYPES[entry.dtype])).reshape(entry.shape)
        return tensor if self._on_cpu else tensor.to(self.device)
