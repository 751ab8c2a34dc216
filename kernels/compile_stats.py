"""What the compiler says about one compiled kernel: registers, spills, stack, shared memory, occupancy,
tensor-core instructions. Read from the compiler's own output, for a target without its device.

* NVIDIA (``cuda``): ``ptxas -v`` on the kernel's PTX with the flags Triton's backend compiles it with
  (registers, spill stores, stack frame), Triton's metadata for the dynamic shared memory, and the PTX
  for ``wgmma.mma_async`` / ``mma.sync`` instructions and fp32 FMAs.
* AMD (``hip``): the ``amdhsa`` metadata of the amdgcn text (``.vgpr_count``, ``.agpr_count``,
  ``.vgpr_spill_count``, ``.sgpr_spill_count``, ``.private_segment_fixed_size``,
  ``.group_segment_fixed_size``), Triton's metadata for the dynamic LDS, and the amdgcn text for
  ``v_mfma_*`` instructions and fp32 FMAs.

Instruction counts are static (instructions in the binary, not executed ones): a main loop's MMAs
count once however many times the loop runs.
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["HwTarget", "HW_TARGETS", "KernelStats", "LOW_PRECISION", "FP32_OPERANDS", "kernel_stats"]

LOW_PRECISION = ("bf16", "f16", "fp8", "i8")  # tensor-core operand types that count as using the hardware
FP32_OPERANDS = ("f32", "tf32", "xf32")  # fp32-operand MMAs: on tensor cores, but at a fraction of the rate


@dataclass(frozen=True)
class HwTarget:
    """One compile target and the per-SM / per-CU limits its occupancy is computed from."""

    name: str
    backend: str  # "cuda" | "hip"
    arch: object  # GPUTarget.arch: 90, "gfx942", ...
    warp_size: int
    smem_limit: int  # bytes of shared memory / LDS one block may use
    smem_per_sm: int  # bytes per SM / CU (blocks share it)
    regs_per_sm: int  # cuda: 32-bit registers per SM; hip: VGPRs per SIMD lane (unified VGPR + AGPR file)
    max_warps: int  # cuda: warps per SM; hip: waves per SIMD
    max_blocks: int  # resident blocks per SM / CU


# Limits: H100 / H200 (sm90) 227 KiB of shared memory per block, 228 KiB and 64K registers per SM;
# MI300X (gfx942) 64 KiB of LDS per CU, MI355X (gfx950) 160 KiB; CDNA3 / CDNA4 SIMDs hold 512 VGPRs
# (arch + AGPR) per lane and up to 8 waves.
HW_TARGETS: dict[str, HwTarget] = {
    "sm90": HwTarget("sm90", "cuda", 90, 32, smem_limit=232448, smem_per_sm=233472, regs_per_sm=65536,
                     max_warps=64, max_blocks=32),
    "gfx942": HwTarget("gfx942", "hip", "gfx942", 64, smem_limit=65536, smem_per_sm=65536, regs_per_sm=512,
                       max_warps=8, max_blocks=32),
    "gfx950": HwTarget("gfx950", "hip", "gfx950", 64, smem_limit=163840, smem_per_sm=163840, regs_per_sm=512,
                       max_warps=8, max_blocks=32),
}


@dataclass
class KernelStats:
    """Figures of one compiled kernel (per thread / lane where it says so)."""

    num_warps: int
    regs: int  # cuda: registers per thread; hip: arch VGPRs per lane
    agprs: int  # hip: accumulation VGPRs per lane (0 on cuda)
    spill_bytes: int  # cuda: spill-store bytes per thread; hip: 4 x spilled VGPRs per lane
    sgpr_spills: int  # hip only: SGPRs spilled (to VGPR lanes, not memory)
    stack: int  # bytes of stack frame / private segment per thread
    smem: int  # bytes of shared memory / LDS per block (static + dynamic)
    occupancy: int  # resident blocks per SM / CU (registers, shared memory, warps and the block cap)
    mma: Counter = field(default_factory=Counter)  # operand type -> static count of tensor-core instructions
    mma_names: Counter = field(default_factory=Counter)  # instruction -> static count
    fma_f32: int = 0  # static count of scalar / packed fp32 FMA instructions

    @property
    def low_precision_mma(self) -> int:
        return sum(self.mma[t] for t in LOW_PRECISION)

    @property
    def fp32_mma(self) -> int:
        return sum(self.mma[t] for t in FP32_OPERANDS)


def kernel_stats(compiled, target: HwTarget) -> KernelStats:
    """The :class:`KernelStats` of ``compiled`` (a ``triton.compile`` result for ``target``)."""
    return _cuda_stats(compiled, target) if target.backend == "cuda" else _hip_stats(compiled, target)


# ---- NVIDIA ---------------------------------------------------------------------------------------------------------

_PTX_MMA = re.compile(r"\b(wgmma\.mma_async|mma\.sync)\.[\w.]+")


def _ptx_operand(name: str) -> str:
    parts = name.split(".")
    for t, kind in (("e4m3", "fp8"), ("e5m2", "fp8"), ("bf16", "bf16"), ("f16", "f16"), ("tf32", "tf32"),
                    ("s8", "i8"), ("u8", "i8")):
        if t in parts:
            return kind
    return "f32" if parts.count("f32") > 1 or "f64" in parts else "other"


#: ``ptxas -v`` logs by (arch, PTX text): variants of both models often compile to the same PTX (a shape that is
#: a runtime argument, the same head size), and the report assembled each one again (155 runs for 72 distinct
#: PTX texts at sm90); the log depends on nothing else.
_PTXAS_LOGS: dict[tuple[object, str], str] = {}


def _ptxas_log(compiled, target: HwTarget) -> str:
    ptx = compiled.asm["ptx"]
    key = (target.arch, ptx)
    if key not in _PTXAS_LOGS:
        _PTXAS_LOGS[key] = _run_ptxas(ptx, target)
    return _PTXAS_LOGS[key]


def _run_ptxas(ptx: str, target: HwTarget) -> str:
    from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability
    ptxas = get_ptxas(target.arch).path
    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "k.ptx"
        src.write_text(ptx)
        cmd = [ptxas, "-lineinfo", "-v", "--regAllocOptLevel=2", f"--gpu-name={sm_arch_from_capability(target.arch)}",
               str(src), "-o", str(Path(d) / "k.o")]
        return subprocess.run(cmd, check=True, capture_output=True, text=True).stderr


def _first_int(pattern: str, text: str) -> int:
    m = re.search(pattern, text)
    if m is None:
        raise RuntimeError(f"compiler output lacks {pattern!r}")
    return int(m.group(1))


def _cuda_stats(compiled, target: HwTarget) -> KernelStats:
    log = _ptxas_log(compiled, target)
    md = compiled.metadata
    regs = _first_int(r"Used (\d+) registers", log)
    smem = md.shared  # Triton kernels use dynamic shared memory only
    warps = md.num_warps
    per_warp = -(-regs * 32 // 256) * 256  # registers are allocated per warp in units of 256
    by_regs = target.regs_per_sm // (per_warp * warps) if regs else target.max_blocks
    by_smem = target.smem_per_sm // (smem + 1024) if smem else target.max_blocks  # 1 KiB reserved per block
    occ = min(by_regs, by_smem, target.max_warps // warps, target.max_blocks) if smem <= target.smem_limit else 0
    ptx = compiled.asm["ptx"]
    names = Counter(m.group(0) for m in _PTX_MMA.finditer(ptx))
    mma = Counter()
    for name, n in names.items():
        mma[_ptx_operand(name)] += n
    return KernelStats(num_warps=warps, regs=regs, agprs=0, spill_bytes=_first_int(r"(\d+) bytes spill stores", log),
                       sgpr_spills=0, stack=_first_int(r"(\d+) bytes stack frame", log), smem=smem, occupancy=occ,
                       mma=mma, mma_names=names, fma_f32=len(re.findall(r"\bfma\.rn(?:\.ftz)?\.f32\b", ptx)))


# ---- AMD ------------------------------------------------------------------------------------------------------------

_MFMA = re.compile(r"\bv_mfma_\w+")


def _mfma_operand(name: str) -> str:
    for t, kind in (("f8f6f4", "fp8"), ("fp8", "fp8"), ("bf8", "fp8"), ("bf16", "bf16"), ("xf32", "xf32"),
                    ("i8", "i8"), ("f16", "f16")):
        if name.endswith(t) or f"_{t}_" in name or name.endswith(f"{t}_1k"):
            return kind
    return "f32" if name.endswith("_f32") else "other"


def _hip_meta(text: str, key: str) -> int:
    return _first_int(rf"\n\s+\.{key}:\s+(\d+)", text)


def _hip_set(text: str, kernel: str, what: str) -> int:
    return _first_int(rf"\.set {re.escape(kernel)}\.{what}, (\d+)", text)


def _hip_stats(compiled, target: HwTarget) -> KernelStats:
    text = compiled.asm["amdgcn"]
    md = compiled.metadata
    vgprs = _hip_set(text, md.name, "num_vgpr")  # architectural VGPRs (the metadata's .vgpr_count adds the AGPRs)
    agprs = _hip_set(text, md.name, "num_agpr")
    smem = md.shared + _hip_meta(text, "group_segment_fixed_size")
    warps = md.num_warps
    total = -(-(-(-vgprs // 4) * 4 + agprs) // 8) * 8  # AGPRs start at a 4-aligned offset; allocated in 8s
    waves_per_simd = min(target.max_warps, target.regs_per_sm // total) if total else target.max_warps
    by_regs = 4 * waves_per_simd // warps  # a CU has 4 SIMDs; a block's waves spread over them
    by_smem = target.smem_per_sm // smem if smem else target.max_blocks
    occ = min(by_regs, by_smem, target.max_blocks) if smem <= target.smem_limit else 0
    names = Counter(m.group(0) for m in _MFMA.finditer(text))
    mma = Counter()
    for name, n in names.items():
        mma[_mfma_operand(name)] += n
    fma = len(re.findall(r"\bv_(?:fma|fmac|pk_fma)_f32\b", text))
    return KernelStats(num_warps=warps, regs=vgprs, agprs=agprs, spill_bytes=4 * _hip_meta(text, "vgpr_spill_count"),
                       sgpr_spills=_hip_meta(text, "sgpr_spill_count"),
                       stack=_hip_meta(text, "private_segment_fixed_size"), smem=smem, occupancy=occ, mma=mma,
                       mma_names=names, fma_f32=fma)
