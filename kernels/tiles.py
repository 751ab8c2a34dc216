"""Tile choices of every Triton kernel, per kernel family and per target family, in one table.

A *target family* is where a launch runs:

* ``interpreter``: CPU tensors under ``TRITON_INTERPRET=1``. Each program costs about a millisecond of
  Python, so tiles are wide and grids small (tests stay fast); registers do not exist there.
* ``cuda``: NVIDIA GPUs (sm90 is the target the compile report checks).
* ``hip``: AMD GPUs (gfx942 / gfx950; wave64, 512 VGPRs per SIMD lane, 64 KiB (gfx942) / 160 KiB
  (gfx950) of LDS per CU).

A wrapper asks :func:`tiles_for` with its tensors' device. The offline compile report
(:mod:`atom.kernels.compile_report`) launches the wrappers on CPU tensors inside
:func:`target_family`, so they pick the GPU family's tiles it compiles for; nothing else overrides
the device's family.

The values are the ones the kernels used when each chose its own; changing a value here changes the
launch of every kernel of that family on that target (and the compile report shows the effect).
"""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass
from typing import Iterator

import torch

__all__ = ["TARGET_FAMILIES", "Tiles", "TILES", "device_family", "target_family", "tiles_for", "fp8_fnuz"]

TARGET_FAMILIES = ("interpreter", "cuda", "hip")


@dataclass(frozen=True)
class Tiles:
    """The tile sizes of one target family. Each field names its kernel family."""

    copy_rows: int  # row copy / encode kernels (swa_write, compressed_write, compressor_state): rows per program
    copy_width: int  # ... and the widest column tile (elements)
    entry_pool_width: int  # entry_pool: column tile
    codec_rows: int  # fp8_ds_mla / fp8 index-key quantize and dequantize: rows per program
    index_tokens: int  # build_window_index / build_comp_index: tokens per program
    index_width: int  # ... and the widest index tile
    attn_heads: int  # sparse_attention: most heads per program (at least 16, the dot's minimum)
    attn_rows: int  # sparse_attention: KV rows per online-softmax step
    attn_warps: int  # sparse_attention: warps (waves) per program
    attn_split_below: int  # sparse_attention: fewer programs than this split each token's key list
    score_rows: int  # index_score: candidate keys per program
    gemm_bn: int  # fp8 / mxfp4 weight GEMMs: output columns per program (divides 128)
    gemm_bk: int  # ... inputs per K step (divides 128, a multiple of 32)
    sinkhorn_tokens: int  # hc_sinkhorn: tokens per program
    moe_bm: int  # fused_moe: most (token, expert) pairs of one expert per program (16 up to this)
    moe_bn: int  # ... output columns per program (divides 128)
    moe_bk: int  # ... inputs per K step (divides 128, a multiple of 32 and of the FP8 activation block)
    native_bf16_dot: bool  # bf16 tl.dot on tensor cores (the interpreter's is wrong: it emulates it in fp32)


TILES: dict[str, Tiles] = {
    "interpreter": Tiles(copy_rows=64, copy_width=4096, entry_pool_width=4096, codec_rows=64, index_tokens=64,
                         index_width=1024, attn_heads=64, attn_rows=64, attn_warps=4, attn_split_below=0,
                         score_rows=64, gemm_bn=128, gemm_bk=128, sinkhorn_tokens=16, moe_bm=64, moe_bn=128, moe_bk=128,
                         native_bf16_dot=False),
    # sm90: 16 KV rows per step keep the fp8_ds_mla decode, the bf16 q and the [16, 512] fp32 accumulator
    # within 255 registers without spills at 2 blocks per SM (32 rows spill; see docs/kernels.md). Splits
    # of the key list until 264 programs: 2 blocks on each of an H100 / H200's 132 SMs.
    "cuda": Tiles(copy_rows=16, copy_width=512, entry_pool_width=64, codec_rows=16, index_tokens=16,
                  index_width=128, attn_heads=16, attn_rows=16, attn_warps=4, attn_split_below=264,
                  score_rows=32, gemm_bn=64, gemm_bk=128, sinkhorn_tokens=16, moe_bm=16, moe_bn=32, moe_bk=128,
                  native_bf16_dot=True),
    # gfx942 / gfx950: 2 waves per attention block keep 2 blocks per CU on both (with 4 waves gfx950 needs
    # 256 VGPRs + AGPRs: 1 block per CU). 608 programs: 2 blocks on each of an MI300X's 304 CUs.
    "hip": Tiles(copy_rows=16, copy_width=512, entry_pool_width=64, codec_rows=16, index_tokens=16,
                 index_width=128, attn_heads=16, attn_rows=16, attn_warps=2, attn_split_below=608,
                 score_rows=32, gemm_bn=64, gemm_bk=128, sinkhorn_tokens=16, moe_bm=16, moe_bn=64, moe_bk=128,
                 native_bf16_dot=True),
}

_override = threading.local()


def device_family(device: torch.device) -> str:
    """The target family of ``device``: ``interpreter`` for CPU tensors, else ``hip`` on a ROCm build of
    torch and ``cuda`` otherwise."""
    if device.type == "cpu":
        return "interpreter"
    return "hip" if getattr(torch.version, "hip", None) else "cuda"


def tiles_for(device: torch.device) -> Tiles:
    """The tiles a launch on ``device`` uses (the :func:`target_family` override first, if one is active)."""
    return TILES[getattr(_override, "family", None) or device_family(device)]


def fp8_fnuz(device: torch.device) -> bool:
    """Whether a launch on ``device`` multiplies FP8 as ``e4m3fnuz`` (gfx942, MI300; sm90 and gfx950 take
    ``e4m3fn``): the :func:`target_family` ``arch`` override first, else the ROCm device's architecture name."""
    arch = getattr(_override, "arch", None)
    if arch is not None:
        return str(arch) == "gfx942"
    if device.type != "cuda" or not getattr(torch.version, "hip", None):
        return False
    return "gfx94" in getattr(torch.cuda.get_device_properties(device), "gcnArchName", "")


@contextlib.contextmanager
def target_family(family: str, arch: object = None) -> Iterator[None]:
    """Within the block (this thread), every wrapper picks ``family``'s tiles whatever its tensors' device, and
    compiles for ``arch`` (e.g. ``"gfx942"``, ``90``) where a kernel's code depends on it (:func:`fp8_fnuz`)."""
    if family not in TILES:
        raise ValueError(f"target family {family!r}; accepted: {', '.join(TILES)}")
    previous = getattr(_override, "family", None), getattr(_override, "arch", None)
    _override.family, _override.arch = family, arch
    try:
        yield
    finally:
        _override.family, _override.arch = previous
