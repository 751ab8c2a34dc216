"""Checks of the encode contract every arena row codec shares (``atom.kernels.quant_formats.check_row_encode``):
rows written into a strided byte view and nowhere else, and the refusals of a bad input or output."""

from __future__ import annotations

from typing import Callable

import pytest
import torch

from support.kernels import assert_same_bits

GUARD = 0xAB  # the byte the buffer around the rows holds; a write outside the rows shows as another value


def assert_encodes_into_strided_rows(encode: Callable[..., torch.Tensor], reference: Callable[..., torch.Tensor],
                                     x: torch.Tensor, row_bytes: int, pitch: int, **kwargs: object) -> None:
    """``encode(x, rows, **kwargs)`` into ``rows``, a ``[len(x), row_bytes]`` uint8 view whose rows stand
    ``pitch`` bytes apart, 3 bytes into a guard-filled buffer, writes exactly ``reference(x, **kwargs)`` and
    leaves every other byte of the buffer (the gaps between rows and the bytes before them) untouched."""
    n = x.shape[0]
    buf = torch.full((3 + n * pitch,), GUARD, dtype=torch.uint8)
    rows = buf[3:].view(n, pitch)[:, :row_bytes]
    encode(x, rows, **kwargs)
    assert_same_bits(rows, reference(x, **kwargs))
    assert bool((buf[3:].view(n, pitch)[:, row_bytes:] == GUARD).all()) and bool((buf[:3] == GUARD).all())


def assert_encode_refuses_bad_rows(encode: Callable[..., torch.Tensor], dim: int, row_bytes: int) -> None:
    """``encode`` (default layout: ``dim`` values to a ``row_bytes``-byte row) raises ``ValueError`` naming
    the fault for an input of another width, an output that is not uint8, and an output with another row
    count than the input."""
    with pytest.raises(ValueError, match="width"):
        encode(torch.zeros(2, dim - 12))
    with pytest.raises(ValueError, match="dtype"):
        encode(torch.zeros(2, dim), torch.zeros(2, row_bytes, dtype=torch.int8))
    with pytest.raises(ValueError, match="rows"):
        encode(torch.zeros(2, dim), torch.zeros(3, row_bytes, dtype=torch.uint8))
