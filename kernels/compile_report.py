"""Offline compile report: every Triton kernel variant the engine launches, compiled for GPU targets
without their device, with what the compiler says about registers, spills, shared memory, occupancy
and tensor-core use.

    python -m atom.kernels.compile_report --targets sm90,gfx942,gfx950 [--model flash|pro]

How it works: each kernel's own wrapper is called on small CPU tensors of the engine's launch shapes
(widths, heads and index widths from the model's published ``config.json``; few rows, since row counts
are runtime arguments) inside :func:`~atom.kernels.tiles.target_family`, so it picks the target's tiles;
the launch is captured instead of run, specialised exactly as Triton's launcher would, and compiled with
``triton.compile`` for the target (:mod:`atom.kernels.compile_stats` reads the results). Must run
without ``TRITON_INTERPRET`` (the interpreter has no compiler).

The last line is ``spill_bytes_max=<int> no_tensor_core=<int> smem_over=<int>``: the largest spill of
any variant; the attention, indexer, GEMM and MoE variants that have no bf16 / fp8 tensor-core
instruction or any fp32-operand one; and the variants over the shared-memory limit plus those
attention / indexer / GEMM / MoE variants with fewer than 2 blocks per SM / CU. Over all targets and
models of the run. See docs/kernels.md for how to read the table.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from dataclasses import dataclass
from typing import Callable, Iterator

import torch

from atom.config import Dsv4KvSpec, load_hf_config, preset_path
from atom.kv_group import CSA_OVERLAP_ROWS, CSA_RATIO, CSA_STATE_RING

from ._common import HAS_TRITON, value_checks_off
from .compile_stats import HW_TARGETS, HwTarget, KernelStats, kernel_stats
from .fp8_ds_mla import Fp8DsMlaLayout
from .fp8_index_key import Fp8IndexKeyLayout
from .tiles import target_family

__all__ = ["MODELS", "Geometry", "Variant", "variants", "compile_variant", "main"]

MODELS = {"flash": "deepseek_v4_flash", "pro": "deepseek_v4_pro"}
HW_FAMILIES = ("attention", "indexer", "gemm", "moe")  # must use tensor cores and keep 2 blocks per SM / CU
DECODE_TOKENS = 64  # the decode batch the report compiles at (M of the GEMMs besides M = 1)
PREFILL_TOKENS = 2048  # the prefill chunk of the fused MoE variants (its row tile follows pairs per expert)
ROWS = 256  # rows of every arena view and state pool (a runtime argument: it does not change the code)


@dataclass(frozen=True)
class Geometry:
    """The launch shapes of one model, read from its published ``config.json``."""

    model: str
    heads: int
    head_dim: int
    rope_dim: int
    window: int
    index_heads: int
    index_dim: int
    index_topk: int
    hidden: int
    q_lora: int
    moe_inter: int
    hc: int
    hca_ratio: int
    experts: int
    topk: int

    @classmethod
    def from_preset(cls, model: str) -> "Geometry":
        if model not in MODELS:
            raise ValueError(f"model {model!r}; accepted: {', '.join(MODELS)}")
        d = load_hf_config(preset_path(MODELS[model]))
        ratios = [r for r in d["compress_ratios"] if r and r != CSA_RATIO]
        return cls(model, d["num_attention_heads"], d["head_dim"], d["qk_rope_head_dim"], d["sliding_window"],
                   d["index_n_heads"], d["index_head_dim"], d["index_topk"], d["hidden_size"], d["q_lora_rank"],
                   d["moe_intermediate_size"], d["hc_mult"], max(ratios), d["n_routed_experts"],
                   d["num_experts_per_tok"])

    @property
    def row_codec(self) -> Fp8DsMlaLayout:
        return Fp8DsMlaLayout(nope=self.head_dim - self.rope_dim, rope=self.rope_dim, qblock=64)

    @property
    def key_codec(self) -> Fp8IndexKeyLayout:
        return Fp8IndexKeyLayout(dim=self.index_dim)


@dataclass(frozen=True)
class Variant:
    """One launch of one wrapper: ``launch()`` calls the wrapper (its kernels are captured, not run).
    A kernel named in ``kernel_families`` (a helper launch, e.g. the split-merge) gets that family."""

    family: str
    name: str
    launch: Callable[[], object]
    kernel_families: tuple[tuple[str, str], ...] = ()

    def family_of(self, kernel: str) -> str:
        return dict(self.kernel_families).get(kernel, self.family)


def _i32(*shape: int, fill: int = 0) -> torch.Tensor:
    return torch.full(shape, fill, dtype=torch.int32)


def _i64(*shape: int) -> torch.Tensor:
    return torch.zeros(shape, dtype=torch.int64)


def _f32(*shape: int) -> torch.Tensor:
    return torch.zeros(shape, dtype=torch.float32)


def _bf16(*shape: int) -> torch.Tensor:
    return torch.zeros(shape, dtype=torch.bfloat16)


def _u8(*shape: int) -> torch.Tensor:
    return torch.zeros(shape, dtype=torch.uint8)


def _stacked_experts(g: Geometry, fmt: str) -> tuple[torch.Tensor, ...]:
    """``(w1, w3, w2, s1, s3, s2)`` of ``g.experts`` experts in ``fmt`` as views of one expert's storage
    (stride 0 over the experts: the launch shapes without the memory)."""
    def one(n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        if fmt == "fp8":
            w = torch.zeros(1, n, k, dtype=torch.float8_e4m3fn)
            s = torch.zeros(1, -(-n // 128), -(-k // 128), dtype=torch.float8_e8m0fnu)
        else:
            w, s = torch.zeros(1, n, k // 2, dtype=torch.uint8), torch.zeros(1, n, k // 32, dtype=torch.float8_e8m0fnu)
        return w.expand(g.experts, -1, -1), s.expand(g.experts, -1, -1)
    (w1, s1), (w3, s3), (w2, s2) = one(g.moe_inter, g.hidden), one(g.moe_inter, g.hidden), one(g.hidden, g.moe_inter)
    return w1, w3, w2, s1, s3, s2


def variants(g: Geometry) -> list[Variant]:
    """Every kernel variant the engine launches at ``g``'s shapes (decode batch :data:`DECODE_TOKENS`)."""
    from . import (act_quant, compressed_write, compressor_state, entry_pool, fp8_ds_mla, fp8_gemm, fp8_index_key,
                   fused_moe, hc_post, hc_pre, hc_sinkhorn, hca_state, index_score, index_topk, moe_route,
                   mxfp4_gemm, page_copy, paged_index, rms_norm, rope, rope_kv_write, sparse_attention, swa_write,
                   swiglu, w8a8_gemm)
    t, rc, kc = DECODE_TOKENS, g.row_codec, g.key_codec
    seqs, cu, start = _i32(t), torch.arange(t + 1, dtype=torch.int32), _i32(t)
    main_rows, key_rows = _u8(ROWS, rc.row_bytes), _u8(ROWS, kc.row_bytes)
    table, comp_geo = _i32(t, 4), dict(entries_per_block=32, pages_per_chunk=1, chunk_rows=32)
    q, win = _bf16(t, g.heads, g.head_dim), _i32(t, g.window)
    comp_idx = _i32(t, g.index_topk)
    sink = _f32(g.heads)
    out: list[Variant] = []

    def add(family: str, name: str, fn: Callable[[], object], **kernel_families: str) -> None:
        out.append(Variant(family, name, fn, tuple(kernel_families.items())))

    scale = float(g.head_dim) ** -0.5
    merge = dict(_combine_kernel="merge")  # the split-merge is elementwise: no dot to put on tensor cores
    for n in (1, t):  # decode at batch 1 (each token's keys split) and batch t (split only when the GPU is not full)
        add("attention", f"sparse_attention fp8_ds_mla swa T={n} H={g.heads}",
            lambda n=n: sparse_attention.sparse_attention(q[:n], main_rows, win[:n], None, None, sink, scale=scale,
                                                          codec=rc), **merge)
        add("attention", f"sparse_attention fp8_ds_mla swa+comp T={n} H={g.heads}",
            lambda n=n: sparse_attention.sparse_attention(q[:n], main_rows, win[:n], main_rows, comp_idx[:n], sink,
                                                          scale=scale, codec=rc), **merge)
    add("attention", f"sparse_attention bf16 swa+comp T={t} H={g.heads}", lambda: sparse_attention.sparse_attention(
        q, _bf16(ROWS, g.head_dim), win, _bf16(ROWS, g.head_dim), comp_idx, sink, scale=scale), **merge)
    iq, iw = _bf16(t, g.index_heads, g.index_dim), _bf16(t, g.index_heads)
    w_scale = (g.index_dim * g.index_heads) ** -0.5  # the head weights' scale, multiplied in the kernel
    add("indexer", f"index_score fp8 keys H={g.index_heads}", lambda: index_score.index_score(
        iq, iw, key_rows, _i32(t, 4096), codec=kc, w_scale=w_scale))
    add("indexer", f"index_score bf16 keys H={g.index_heads}", lambda: index_score.index_score(
        iq, iw, _bf16(ROWS, g.index_dim), _i32(t, 4096), w_scale=w_scale))
    add("select", f"index_topk N=4096 k={g.index_topk}", lambda: index_topk.index_topk(  # a radix select: no dot
        _f32(t, 4096), _i32(t), g.index_topk))
    qkv = g.heads * g.head_dim
    for m in (1, t):
        add("gemm", f"fp8_block_gemm wq_b M={m} N={qkv} K={g.q_lora}", lambda m=m: fp8_gemm.fp8_block_gemm(
            _bf16(m, g.q_lora), torch.zeros(qkv, g.q_lora, dtype=torch.float8_e4m3fn),
            torch.zeros(qkv // 128, g.q_lora // 128, dtype=torch.float8_e8m0fnu)))
        add("moe", f"mxfp4_gemm expert w1 M={m} N={g.moe_inter} K={g.hidden}", lambda m=m: mxfp4_gemm.mxfp4_gemm(
            _bf16(m, g.hidden), _u8(g.moe_inter, g.hidden // 2),
            torch.zeros(g.moe_inter, g.hidden // 32, dtype=torch.float8_e8m0fnu)))
    for label, n, k in (("wq_a", g.q_lora, g.hidden), ("wq_b", qkv, g.q_lora)):
        for m in (1, t, PREFILL_TOKENS):
            add("gemm", f"w8a8_block_gemm {label} M={m} N={n} K={k}", lambda m=m, n=n, k=k: w8a8_gemm.w8a8_block_gemm(
                torch.zeros(m, k, dtype=torch.float8_e4m3fn), _f32(m, k // 128),
                torch.zeros(n, k, dtype=torch.float8_e4m3fn), torch.zeros(n // 128, k // 128, dtype=torch.float8_e8m0fnu),
                torch.bfloat16))
    for fmt in ("mxfp4", "fp8"):
        for m in (t, PREFILL_TOKENS):
            add("moe", f"fused_moe {fmt} T={m} E={g.experts} k={g.topk} I={g.moe_inter} D={g.hidden}",
                lambda fmt=fmt, m=m: fused_moe.fused_moe(
                    _bf16(m, g.hidden), _f32(m, g.topk), _i32(m, g.topk), *_stacked_experts(g, fmt),
                    limit=10.0, act_blocks=(128, 128), shared=_bf16(m, g.hidden)),  # as the serving MoE calls it
                _moe_permute_kernel="permute")  # a counting sort: no dot
    add("kv write", "swa_write fp8_ds_mla", lambda: swa_write.swa_write(
        _bf16(t, g.head_dim), main_rows, table, seqs, start, block_size=128, row_stride=128, codec=rc))
    freqs = _f32(g.rope_dim // 2)
    for fp8_block, label in ((64, " quant_sim"), (0, "")):  # the NoPE round trip of the release numerics, or none
        add("kv write", f"rope_kv_write fp8_ds_mla{label}", lambda fp8_block=fp8_block: rope_kv_write.rope_kv_write(
            _bf16(t, g.head_dim), main_rows, table, seqs, start, freqs, block_size=128, row_stride=128,
            fp8_block=fp8_block, codec=rc))
    add("kv write", "rope_kv_write bf16 rows quant_sim", lambda: rope_kv_write.rope_kv_write(
        _bf16(t, g.head_dim), _bf16(ROWS, g.head_dim), table, seqs, start, freqs, block_size=128, row_stride=128,
        fp8_block=64))
    for fp8_block, label in ((64, " quant_sim"), (0, "")):  # with kv_norm, as the serving attention runs it
        add("kv write", f"rope_kv_write kv_norm fp8_ds_mla{label}", lambda fp8_block=fp8_block:
            rope_kv_write.rope_kv_write(_bf16(t, g.head_dim), main_rows, table, seqs, start, freqs, block_size=128,
                                        row_stride=128, fp8_block=fp8_block, codec=rc, norm_weight=_bf16(g.head_dim),
                                        norm_eps=1e-6))
    add("kv write", "rope_kv_write kv_norm bf16 rows quant_sim", lambda: rope_kv_write.rope_kv_write(
        _bf16(t, g.head_dim), _bf16(ROWS, g.head_dim), table, seqs, start, freqs, block_size=128, row_stride=128,
        fp8_block=64, norm_weight=_bf16(g.head_dim), norm_eps=1e-6))
    add("kv write", "compressed_write fp8_ds_mla", lambda: compressed_write.compressed_write(
        _bf16(t, g.head_dim), main_rows, table, seqs, start, codec=rc, **comp_geo))
    add("kv write", "compressed_write fp8 index keys", lambda: compressed_write.compressed_write(
        _bf16(t, g.index_dim), key_rows, table, seqs, start, codec=kc, **comp_geo))
    for label, c in (("main", g.head_dim), ("index", g.index_dim)):
        w = 2 * c  # a CSA compressor's rows hold both overlapping halves
        add("state", f"compressor_state_update {label} W={w}", lambda w=w: compressor_state.compressor_state_update(
            _f32(t, w), _f32(t, w), _f32(CSA_RATIO, w), _f32(8, CSA_STATE_RING, w), _f32(8, CSA_STATE_RING, w),
            _i32(t), cu, start))
        add("state", f"csa_boundary_capture {label} W={w}", lambda w=w: compressor_state.csa_boundary_capture(
            _f32(t, w), _f32(t, w), _f32(CSA_RATIO, w), _f32(8, CSA_OVERLAP_ROWS, w), _f32(8, CSA_OVERLAP_ROWS, w),
            table, cu, start, block_size=128))
        add("state", f"csa_state_write {label} W={w}", lambda w=w: compressor_state.csa_state_write(
            _f32(t, w), _f32(t, w), _f32(CSA_RATIO, w), _f32(8, CSA_STATE_RING, w), _f32(8, CSA_STATE_RING, w),
            _i32(t), _f32(8, CSA_OVERLAP_ROWS, w), _f32(8, CSA_OVERLAP_ROWS, w), table, cu, start, start,
            block_size=128))
        add("state", f"csa_boundary_restore {label} W={w}", lambda w=w: compressor_state.csa_boundary_restore(
            _f32(8, CSA_OVERLAP_ROWS, w), _f32(8, CSA_OVERLAP_ROWS, w), _f32(8, CSA_STATE_RING, w),
            _f32(8, CSA_STATE_RING, w), _i32(t, fill=-1), _i32(t), _i32(t, fill=4)))
        r = CSA_RATIO + CSA_OVERLAP_ROWS
        add("state", f"entry_pool {label} W={w}", lambda w=w, c=c, r=r: entry_pool.entry_pool(
            _f32(t, w), _f32(t, w), _f32(CSA_RATIO, w), _i32(t), _f32(8, CSA_STATE_RING, w),
            _f32(8, CSA_STATE_RING, w), _i32(t, r, fill=-1), _i32(t, r, fill=-1), _i32(r), width=c))
    add("state", f"hca_state_update ratio={g.hca_ratio}", lambda: hca_state.hca_state_update(
        _f32(t, g.head_dim), _f32(t, g.head_dim), _f32(g.hca_ratio, g.head_dim), _f32(8, 3, g.head_dim), _i32(t),
        cu, start, _f32(t, g.head_dim), max_len=1))
    geo = dict(block_size=128, row_stride=128)
    add("index", f"build_window_index W={g.window}", lambda: paged_index.build_window_index(
        table, seqs, start, window=g.window, **geo))
    add("index", "build_comp_index hca", lambda: paged_index.build_comp_index(
        table, seqs, start, None, width=1024, ratio=g.hca_ratio, entries_per_block=1, pages_per_chunk=32,
        chunk_rows=32))
    add("index", f"build_comp_index csa topk={g.index_topk}", lambda: paged_index.build_comp_index(
        table, seqs, start, _i32(t, g.index_topk, fill=-1), width=g.index_topk, ratio=CSA_RATIO, **comp_geo))
    add("mhc", f"hc_sinkhorn hc={g.hc}", lambda: hc_sinkhorn.hc_sinkhorn(_f32(t, g.hc, g.hc), 20, 1e-6))
    for label, width in (("hidden", g.hidden), ("q_lora", g.q_lora), ("head", g.head_dim)):
        add("small ops", f"rms_norm {label} D={width}", lambda width=width: rms_norm.rms_norm(
            _bf16(t, width), _bf16(width), 1e-6))
    for label, width in (("hidden", g.hidden), ("q_lora", g.q_lora)):
        add("small ops", f"rms_norm_fp8 {label} D={width}", lambda width=width: act_quant.rms_norm_fp8(
            _bf16(t, width), _bf16(width), 1e-6, 128))
    add("small ops", f"fp8_act_quant shared w2 K={g.moe_inter}", lambda: act_quant.fp8_act_quant(
        _bf16(t, g.moe_inter), 128))
    add("small ops", f"rms_norm per-head fp32 H={g.heads} D={g.head_dim}", lambda: rms_norm.rms_norm(
        _f32(t, g.heads, g.head_dim), None, 1e-6))
    add("small ops", f"swiglu I={g.moe_inter}", lambda: swiglu.swiglu(  # the halves of the merged w1 / w3 product
        *_bf16(t, 2 * g.moe_inter).split(g.moe_inter, dim=-1), 10.0, torch.bfloat16))
    add("small ops", f"rope q H={g.heads} D={g.head_dim} R={g.rope_dim}", lambda: rope.rope(
        q, _i64(t), _f32(g.rope_dim // 2), True))
    add("small ops", f"rms_norm_rope q H={g.heads} D={g.head_dim} R={g.rope_dim}", lambda: rope.rms_norm_rope(
        q, None, 1e-6, _i64(t), _f32(g.rope_dim // 2)))
    mix = (2 + g.hc) * g.hc
    add("small ops", f"hc_pre hc={g.hc} D={g.hidden}", lambda: hc_pre.hc_pre(
        _bf16(t, g.hc, g.hidden), _f32(mix, g.hc * g.hidden), _f32(3), _f32(mix), 20, 1e-6, 1e-6))
    add("small ops", f"moe_route E={g.experts} k={g.topk}", lambda: moe_route.moe_route(
        _f32(t, g.experts), _f32(g.experts), None, g.topk, "sqrtsoftplus", 1.5))
    add("small ops", f"moe_route hash E={g.experts} k={g.topk}", lambda: moe_route.moe_route(
        _f32(t, g.experts), None, _i64(1024, g.topk), g.topk, "sqrtsoftplus", 1.5, token_ids=_i64(t)))
    add("small ops", f"hc_post hc={g.hc} D={g.hidden}", lambda: hc_post.hc_post(
        _bf16(t, g.hidden), _bf16(t, g.hc, g.hidden), _f32(t, g.hc), _f32(t, g.hc, g.hc)))
    add("codec", "fp8_ds_mla_quantize", lambda: fp8_ds_mla.fp8_ds_mla_quantize(
        _bf16(t, g.head_dim), _u8(t, rc.row_bytes), layout=rc))
    add("codec", "fp8_ds_mla_dequantize", lambda: fp8_ds_mla.fp8_ds_mla_dequantize(main_rows, layout=rc))
    add("codec", "fp8_index_key_quantize", lambda: fp8_index_key.fp8_index_key_quantize(
        _bf16(t, g.index_dim), _u8(t, kc.row_bytes), layout=kc))
    add("codec", "fp8_index_key_dequantize", lambda: fp8_index_key.fp8_index_key_dequantize(key_rows, layout=kc))
    spec = kv_spec_of(g.model)
    for label, nbytes in (("swa", spec.swa_block_bytes), ("compressed", spec.compressed_block_bytes)):
        add("kv copy", f"copy_pages {label} page {nbytes} B", lambda nbytes=nbytes: page_copy.copy_pages(
            _u8(2, nbytes), _i64(t), _u8(2, nbytes), _i64(t)))
    return out


def kv_spec_of(model: str) -> Dsv4KvSpec:
    """The served KV spec of a preset (main layers and MTP, fp8 rows): the page sizes the copy kernel moves.
    Built from the published ``config.json`` here because the kernels do not import the model package; a
    test checks it equals ``DeepseekV4Config.kv_spec()``."""
    d = load_hf_config(preset_path(MODELS[model]))
    return Dsv4KvSpec(compress_ratios=tuple(d["compress_ratios"]), sliding_window=d["sliding_window"],
                      head_dim=d["head_dim"], rope_head_dim=d["qk_rope_head_dim"], index_head_dim=d["index_head_dim"],
                      num_mtp_layers=d.get("num_nextn_predict_layers", 0))


@contextlib.contextmanager
def _captured_launches() -> Iterator[list]:
    """Within the block, ``kernel[grid](...)`` records ``(kernel, args, kwargs)`` instead of launching."""
    from triton.runtime.jit import JITFunction
    launches: list = []
    original = JITFunction.run

    def record(self, *args, grid, warmup, **kwargs):
        launches.append((self, args, kwargs))

    JITFunction.run = record
    try:
        yield launches
    finally:
        JITFunction.run = original


def _compile(kernel, args: tuple, kwargs: dict, hw: HwTarget):
    """Specialise one captured launch as Triton's launcher does, and compile it for ``hw``.

    Uses the launcher's own binder (``create_function_from_signature``, ``JITFunction._pack_args``) so the
    argument specialisation (alignment, ``== 1``) is the one a real launch gets; these are Triton 3.7.1
    internals (the version pyproject pins for the kernels)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature
    target = GPUTarget(hw.backend, hw.arch, hw.warp_size)
    backend = make_backend(target)
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound, specialization, options)
    return triton.compile(ASTSource(kernel, signature, constexprs, attrs), target=target, options=options.__dict__)


def compile_variant(variant: Variant, hw: HwTarget) -> list[tuple[str, KernelStats]]:
    """``(kernel name, stats)`` of every kernel the variant's wrapper launches, compiled for ``hw``."""
    from triton.runtime.jit import JITFunction
    with target_family(hw.backend, hw.arch), value_checks_off(), _captured_launches() as launches:
        variant.launch()
    if not launches:
        raise RuntimeError(f"{variant.name} launched no Triton kernel")
    out = []
    for kernel, args, kwargs in launches:
        if not isinstance(kernel, JITFunction):
            raise RuntimeError("the compile report needs compiled Triton kernels: run it without TRITON_INTERPRET")
        out.append((kernel.fn.__name__, kernel_stats(_compile(kernel, args, kwargs, hw), hw)))
    return out


def _mma_text(s: KernelStats) -> str:
    kinds = ", ".join(f"{k}:{n}" for k, n in sorted(s.mma.items())) or "none"
    return f"{kinds}; fma_f32:{s.fma_f32}"


def _row(hw: HwTarget, model: str, family: str, name: str, s: KernelStats) -> str:
    regs = f"{s.regs}/{s.agprs}" if hw.backend == "hip" else f"{s.regs}"
    return (f"{hw.name:7} {model:5} {family:9} {name:52} {s.num_warps:>2} {regs:>8} {s.spill_bytes:>6} {s.stack:>6} "
            f"{s.smem:>7}/{hw.smem_limit:<7} {s.occupancy:>3}  {_mma_text(s)}")


HEADER = (f"{'target':7} {'model':5} {'family':9} {'variant [kernel]':52} {'wp':>2} {'regs':>8} {'spill':>6} "
          f"{'stack':>6} {'smem/limit':>15} {'occ':>3}  tensor-core instructions by operand type; fp32 FMAs")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m atom.kernels.compile_report", description=__doc__.split("\n\n")[0])
    ap.add_argument("--targets", default="sm90,gfx942,gfx950",
                    help=f"comma-separated targets; accepted: {', '.join(HW_TARGETS)}")
    ap.add_argument("--model", choices=sorted(MODELS), help="one model's shapes (default: both)")
    ap.add_argument("--only", default="", help="only the variants whose family or name contains this text")
    a = ap.parse_args(argv)
    targets = [x.strip() for x in a.targets.split(",") if x.strip()]
    bad = [x for x in targets if x not in HW_TARGETS]
    if bad or not targets:
        ap.error(f"--targets {a.targets!r}: unknown {bad or 'empty list'}; accepted: {', '.join(HW_TARGETS)}")
    if not HAS_TRITON:
        print("the compile report needs triton installed", file=sys.stderr)
        return 2
    spill_max = no_tc = smem_over = failed = 0
    print(HEADER)
    for model in [a.model] if a.model else sorted(MODELS):
        geo = Geometry.from_preset(model)
        for tname in targets:
            hw = HW_TARGETS[tname]
            for v in [v for v in variants(geo) if a.only in v.family or a.only in v.name]:
                try:
                    kernels = compile_variant(v, hw)
                except Exception as e:  # report and go on: one broken variant must not hide the others
                    failed += 1
                    print(f"{hw.name:7} {model:5} {v.family:9} {v.name:52} FAILED: {type(e).__name__}: "
                          + " ".join(str(e).split())[:300])
                    continue
                for kname, s in kernels:
                    family = v.family_of(kname)
                    print(_row(hw, model, family, f"{v.name} [{kname}]", s), flush=True)
                    spill_max = max(spill_max, s.spill_bytes)
                    hw_kernel = family in HW_FAMILIES
                    no_tc += hw_kernel and (s.low_precision_mma == 0 or s.fp32_mma > 0)
                    smem_over += s.smem > hw.smem_limit or (hw_kernel and s.occupancy < 2)
    if failed:
        print(f"failed={failed}")
    print(f"spill_bytes_max={spill_max} no_tensor_core={no_tc} smem_over={smem_over}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
