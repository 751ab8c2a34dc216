"""Helpers shared by the kernel tests: arena-like row views, random tables, bit-exact comparison."""

from __future__ import annotations

import torch

_INT_OF = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16,
           torch.uint8: torch.uint8, torch.float8_e4m3fn: torch.uint8, torch.int32: torch.int32}


def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bit pattern of ``t`` (so NaN == NaN and -0 != +0 in comparisons)."""
    return t.contiguous().view(_INT_OF[t.dtype])


def assert_same_bits(a: torch.Tensor, b: torch.Tensor) -> None:
    assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, a.dtype, b.shape, b.dtype)
    diff = (bits(a) != bits(b))
    first = diff.nonzero()[0].tolist() if bool(diff.any()) else None
    assert first is None, f"{int(diff.sum())} of {diff.numel()} elements differ, first at {first}"


def assert_within_bf16_probability_rounding(got: torch.Tensor, ref: torch.Tensor, rows: torch.Tensor) -> None:
    """Attention with bf16 queries multiplies P @ V on bf16 tensor cores: each probability is rounded to
    bf16 (relative error < 2^-8 under the interpreter's truncation, 2^-9 with a GPU's RTNE) while the
    denominator keeps the fp32 sum, so |out - ref| <= 2^-8 * sum_j p_j |v_j| / l <= 2^-8 * max |v|; the
    bf16 output adds one bf16 ulp (2^-7 relative under truncation). Q K^T is exact: bf16 products fit fp32."""
    bound = 2 ** -8 * float(rows.float().abs().max()) + 2 ** -7 * ref.float().abs()
    err = (got.float() - ref.float()).abs()
    assert bool((err <= bound).all()), float((err - bound).max())


def nan_buffer(numel: int, dtype: torch.dtype) -> torch.Tensor:
    """A flat 'arena' buffer filled with NaN (0xFF for byte dtypes), so unwritten memory shows."""
    if dtype in (torch.uint8, torch.float8_e4m3fn):
        return torch.full((numel,), 0xFF, dtype=torch.uint8).view(dtype)
    return torch.full((numel,), float("nan"), dtype=dtype)


def row_view(buf: torch.Tensor, offset: int, num_rows: int, width: int, pitch: int) -> torch.Tensor:
    """A ``[num_rows, width]`` view of ``buf`` starting ``offset`` elements in, rows ``pitch`` apart."""
    assert pitch >= width and offset + num_rows * pitch <= buf.numel()
    return buf[offset:offset + num_rows * pitch].view(num_rows, pitch)[:, :width]


def arena_rows(num_rows: int, width: int, dtype: torch.dtype, *, offset: int = 7, pitch_extra: int = 3
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """(flat buffer, strided row view into it at an odd offset); everything NaN."""
    pitch = width + pitch_extra
    buf = nan_buffer(offset + num_rows * pitch + 5, dtype)
    return buf, row_view(buf, offset, num_rows, width, pitch)


def random_table(num_seqs: int, max_blocks: int, num_pages: int, gen: torch.Generator, p_missing: float = 0.25
                 ) -> torch.Tensor:
    """int32 page table with distinct pages (each page owned once) and about p_missing of entries -1."""
    need = num_seqs * max_blocks
    assert need <= num_pages
    pages = torch.randperm(num_pages, generator=gen)[:need].view(num_seqs, max_blocks)
    missing = torch.rand(num_seqs, max_blocks, generator=gen) < p_missing
    return torch.where(missing, -1, pages).to(torch.int32)


def random_rows(n: int, width: int, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    if dtype in (torch.uint8, torch.float8_e4m3fn):
        return torch.randint(0, 0x7F, (n, width), generator=gen, dtype=torch.uint8).view(dtype)
    return torch.randn(n, width, generator=gen).to(dtype)


def ragged(lens: list[int], starts: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(cu_seqlens, pos_start) int32 tensors of a ragged batch."""
    cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0).tolist()), dtype=torch.int32)
    return cu, torch.tensor(starts, dtype=torch.int32)


def i32(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32)
