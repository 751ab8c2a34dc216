"""fp32 values rounded for a store to a narrower dtype, the same on a GPU and in the interpreter.

A GPU's fp32 -> bf16 conversion rounds to nearest even; the interpreter's truncates, so a kernel checked there
would differ from its torch reference in the last bf16 bit of about half the values. :func:`rounded_for`
rounds bf16 on the bits (nearest even) before the cast, which then is exact everywhere; other dtypes pass
through (fp32 needs nothing; the interpreter's fp16 cast already rounds to nearest).
"""

from __future__ import annotations

from ._common import HAS_TRITON, triton, tl

__all__ = ["rounded_for"]

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
