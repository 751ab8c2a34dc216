"""The one place that chooses which kernel implementation runs.

Choice (``resolve_backend``), from an explicit override or else ``ATOM_KERNEL_BACKEND`` (read through
:mod:`atom.envs`, never the process environment directly):

* ``auto``: ``aiter`` when ``import aiter`` works (ROCm), else ``triton`` when triton is installed
  and a GPU is visible, else ``torch`` (the references; the CPU default).
* ``torch`` / ``triton`` / ``aiter``: forced. Forcing one that cannot run raises ``ValueError``.
  Tests force ``triton`` on CPU under ``TRITON_INTERPRET=1``.

Every op has a torch reference and a Triton wrapper of the same signature. An aiter implementation
is used for an op only where one is registered with :func:`register_aiter`: ``fp8_block_gemm``
(aiter's ``gemm_a16w8_blockscale``, ``aiter_gemm.py``), ``w8a8_block_gemm`` (aiter's ``gemm_a8w8_blockscale``
where the activation blocks are 128 wide, ``aiter_gemm.py``) and ``fused_moe`` (aiter's ``fused_moe`` where its
arguments map, ``aiter_moe.py``; not run here: no ROCm machine); none of aiter's kernels matches the KV
contracts (the arena's ``row_stride`` and fused c4 chunk are ours) or the packed MXFP4 layout, so
under ``aiter`` an op without an aiter entry runs its Triton wrapper, and :func:`load_kernels`
reports which implementation each op got.

Every wrapper checks its arguments before launch. The checks that read tensor values (table
ranges, top-k causality) sync the device; :func:`value_checks_off` skips them for inputs already
validated (CUDA-graph capture, benchmarks), keeping the shape, dtype and layout checks.
"""

from __future__ import annotations

import functools
import importlib
from dataclasses import dataclass
from typing import Callable

import torch

from ._common import HAS_TRITON, value_checks_off

__all__ = ["OPS", "BACKENDS", "resolve_backend", "get_kernel", "load_kernels", "KernelSet", "register_aiter",
           "aiter_available", "value_checks_off"]

BACKENDS = ("torch", "triton", "aiter")
_CHOICES = ("auto",) + BACKENDS

# op name -> (module in atom.kernels, Triton wrapper, torch reference): the ops the engine dispatches.
# The row formats' standalone codecs (``fp8_ds_mla_quantize`` / ``_dequantize``, ``fp8_index_key_*``)
# are not ops: the write kernels and readers encode and decode in registers, and the codecs are
# imported from their modules by the tests that check those bytes.
OPS: dict[str, tuple[str, str, str]] = {
    "swa_write": ("swa_write", "swa_write", "swa_write_ref"),
    "compressed_write": ("compressed_write", "compressed_write", "compressed_write_ref"),
    "compressor_state_update": ("compressor_state", "compressor_state_update", "compressor_state_update_ref"),
    "csa_boundary_capture": ("compressor_state", "csa_boundary_capture", "csa_boundary_capture_ref"),
    "csa_state_write": ("compressor_state", "csa_state_write", "csa_state_write_ref"),
    "csa_boundary_restore": ("compressor_state", "csa_boundary_restore", "csa_boundary_restore_ref"),
    "hca_state_update": ("hca_state", "hca_state_update", "hca_state_update_ref"),
    "build_window_index": ("paged_index", "build_window_index", "build_window_index_ref"),
    "build_comp_index": ("paged_index", "build_comp_index", "build_comp_index_ref"),
    "sparse_attention": ("sparse_attention", "sparse_attention", "sparse_attention_ref"),
    "index_score": ("index_score", "index_score", "index_score_ref"),
    "index_topk": ("index_topk", "index_topk", "index_topk_ref"),
    "fp8_block_gemm": ("fp8_gemm", "fp8_block_gemm", "fp8_block_gemm_ref"),
    "mxfp4_gemm": ("mxfp4_gemm", "mxfp4_gemm", "mxfp4_gemm_ref"),
    "w8a8_block_gemm": ("w8a8_gemm", "w8a8_block_gemm", "w8a8_block_gemm_ref"),
    "fp8_act_quant": ("act_quant", "fp8_act_quant", "fp8_act_quant_ref"),
    "rms_norm_fp8": ("act_quant", "rms_norm_fp8", "rms_norm_fp8_ref"),
    "hc_sinkhorn": ("hc_sinkhorn", "hc_sinkhorn", "hc_sinkhorn_ref"),
    "entry_pool": ("entry_pool", "entry_pool", "entry_pool_ref"),
    "fused_moe": ("fused_moe", "fused_moe", "fused_moe_ref"),
    "copy_pages": ("page_copy", "copy_pages", "copy_pages_reference"),
    "rms_norm": ("rms_norm", "rms_norm", "rms_norm_ref"),
    "swiglu": ("swiglu", "swiglu", "swiglu_ref"),
    "rope": ("rope", "rope", "rope_ref"),
    "rms_norm_rope": ("rope", "rms_norm_rope", "rms_norm_rope_ref"),
    "rope_kv_write": ("rope_kv_write", "rope_kv_write", "rope_kv_write_ref"),
    "hc_post": ("hc_post", "hc_post", "hc_post_ref"),
    "hc_pre": ("hc_pre", "hc_pre", "hc_pre_ref"),
    "moe_route": ("moe_route", "moe_route", "moe_route_ref"),
}

_AITER: dict[str, Callable] = {}


def register_aiter(op: str, fn: Callable) -> None:
    """Register an aiter-backed implementation of ``op`` (same signature as the reference)."""
    if op not in OPS:
        raise ValueError(f"unknown kernel op {op!r}; known: {', '.join(OPS)}")
    _AITER[op] = fn


@functools.cache
def aiter_available() -> bool:
    """True when ``import aiter`` succeeds (it raises on machines without ROCm)."""
    try:
        importlib.import_module("aiter")
    except Exception:  # aiter raises RuntimeError("ROCm version file not found") on CPU, not ImportError
        return False
    return True


def _configured_choice() -> str:
    from atom import envs

    return envs.load().kernel_backend


def resolve_backend(override: str | None = None) -> str:
    """The backend that runs: ``override`` if given, else ``ATOM_KERNEL_BACKEND`` (default ``auto``)."""
    choice = _configured_choice() if override is None else override
    if choice not in _CHOICES:
        raise ValueError(f"kernel backend {choice!r} is not one of {', '.join(_CHOICES)}")
    if choice == "auto":
        if aiter_available():
            return "aiter"
        return "triton" if HAS_TRITON and torch.cuda.is_available() else "torch"
    if choice in ("triton", "aiter") and not HAS_TRITON:
        raise ValueError(f"kernel backend {choice!r} needs triton, which is not installed")
    if choice == "aiter" and not aiter_available():
        raise ValueError("kernel backend 'aiter' was forced but `import aiter` fails (it needs ROCm)")
    return choice


@functools.cache
def _register_aiter_gemms() -> None:
    """Register the aiter implementations of the quantized GEMMs (``aiter_gemm.py``) once."""
    from .aiter_gemm import aiter_implementations

    from .aiter_moe import fused_moe_aiter

    for op, fn in aiter_implementations().items():
        register_aiter(op, fn)
    register_aiter("fused_moe", fused_moe_aiter)


def _implementation(op: str, backend: str) -> tuple[Callable, str]:
    if op not in OPS:
        raise ValueError(f"unknown kernel op {op!r}; known: {', '.join(OPS)}")
    if backend == "aiter":
        _register_aiter_gemms()
    if backend == "aiter" and op in _AITER:
        return _AITER[op], "aiter"
    module_name, triton_name, ref_name = OPS[op]
    module = importlib.import_module(f"atom.kernels.{module_name}")
    if backend == "torch":
        return getattr(module, ref_name), "torch"
    return getattr(module, triton_name), "triton"


def get_kernel(op: str, backend: str | None = None) -> Callable:
    """The implementation of ``op`` for ``backend`` (resolved by :func:`resolve_backend`)."""
    return _implementation(op, resolve_backend(backend))[0]


@dataclass(frozen=True)
class KernelSet:
    """Every op bound to one backend; ``sources`` says which implementation each op got."""

    backend: str
    ops: dict[str, Callable]
    sources: dict[str, str]

    def __getattr__(self, op: str) -> Callable:
        try:
            return self.ops[op]
        except KeyError:
            raise AttributeError(f"no kernel op {op!r}; known: {', '.join(OPS)}") from None


def load_kernels(backend: str | None = None) -> KernelSet:
    """Resolve the backend once and bind every op (call at start-up, not per step)."""
    name = resolve_backend(backend)
    pairs = {op: _implementation(op, name) for op in OPS}
    return KernelSet(name, {op: fn for op, (fn, _) in pairs.items()},
                     {op: src for op, (_, src) in pairs.items()})
