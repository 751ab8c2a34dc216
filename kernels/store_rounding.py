"""fp32 values rounded for a store to a narrower dtype, the same on a GPU and in the interpreter.

A GPU's fp32 -> bf16 conversion rounds to nearest even; the interpreter's truncates, so a kernel checked there
would differ from its torch reference in the last bf16 bit of about half the values. :func:`rounded_for`
rounds bf16 on the bits (nearest even) before the cast, which then is exact everywhere; other dtypes pass
through (fp32 needs nothing; the interpreter's fp16 cast already rounds to nearest).
:func:`elements_per_program` is the tile budget the row-wise small ops share.
"""

from __future__ import annotations

import torch

from ._common import HAS_TRITON, triton, tl
from .tiles import TILES, tiles_for

__all__ = ["rounded_for", "elements_per_program"]

if HAS_TRITON:

    @triton.jit
    def rounded_for(v, dt: tl.constexpr):
        """fp32 ``v`` rounded to ``dt`` (nearest even) and cast to it."""
        if dt == tl.bfloat16:
            u = v.to(tl.uint32, bitcast=True)
            u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
            v = u.to(tl.float32, bitcast=True)
        return v.to(dt)
else:  # pragma: no cover - installs without triton
    rounded_for = None


def elements_per_program(device: torch.device) -> int:
    """Tile budget (elements) of the row-wise small-op kernels: 4,096 on a GPU (32 fp32 values per thread at 4
    warps), 65,536 in the interpreter, where each program costs about a millisecond of Python however small."""
    return 65536 if tiles_for(device) is TILES["interpreter"] else 4096
