"""GPU benchmark of the DSV4 kernels: ``python -m atom.kernels.bench_kernels [--gemm] [--json out.json]``.

Measures, with the compiled Triton kernels and ``triton.testing.do_bench`` (CUDA events):

* effective bandwidth (bytes read + written / time) of ``swa_write`` (decode and window-only /
  full-retain prefill), ``compressor_state_update``, ``csa_boundary_capture`` / ``restore``,
  ``hca_state_update`` (the HCA online accumulator) and the index builders;
* sparse decode attention time per token at 8K and 128K context, real V4-Flash geometry (head_dim
  512, 64 heads, window 128, CSA top-k 512; HCA attends every completed entry, ctx / 128), on bf16
  rows and on 584-byte ``fp8_ds_mla`` rows decoded inside the kernel (batch 64, 128K context: GB/s of
  row bytes read, to compare with the device's HBM bandwidth), and the fp8 encode-on-write
  ``swa_write``;
* with ``--gemm`` instead, the quantized-weight GEMMs (``fp8_block_gemm``, ``mxfp4_gemm``) in TFLOP/s
  (2 M N K / time) and weight GB/s at V4-Flash shapes, bf16 activations, decode to prefill batch sizes,
  next to a bf16 ``torch.matmul`` of the same shape; the W8A8 GEMM (``w8a8_block_gemm``, FP8 activations)
  alone and after ``fp8_act_quant``; and the fused MoE (``fused_moe``: permutation plus the two grouped
  GEMM launches) with V4-Flash's 256 experts, top-6, dim 4096, intermediate 2048, FP8 and MXFP4 experts, in
  TFLOP/s of the routed pairs' GEMMs (6 x pairs x dim x inter / time).

Value checks are switched off inside the timed calls (:func:`value_checks_off`): they sync the device
and were run once, untimed, on the same inputs. It needs a GPU; without one it prints why and exits
with status 2 without reporting any number. Every case is a function of a :class:`Shapes` (V4-Flash's,
:data:`FLASH`, unless a caller passes smaller ones) and a timer, so the same code runs at toy shapes in the
Triton interpreter on a CPU: the test suite does so, which checks every launch against the kernels'
current signatures without a GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from typing import Callable

import torch

from ._common import value_checks_off

Timer = Callable[[Callable[[], object]], float]


@dataclass(frozen=True)
class Shapes:
    """The sizes the benchmark launches at (defaults: V4-Flash, :data:`FLASH`)."""

    d: int = 512  # head_dim (the fp8_ds_mla row codec is fixed at 448 + 64)
    heads: int = 64
    window: int = 128
    topk: int = 512
    block: int = 128  # tokens per SWA block
    row_stride: int = 224  # rows per SWA page
    write_tokens: int = 256  # decode tokens of one swa_write (16 SWA pages each in the row pool)
    prefill: tuple[int, int] = (16, 1024)  # (sequences, tokens each) of the prefill swa_write
    seqs: int = 64  # sequences of a compressor / HCA chunk
    chunk: int = 512  # tokens each of them
    index_tokens: int = 256
    contexts: tuple[int, ...] = (8 * 1024, 128 * 1024)
    batches: tuple[int, ...] = (1, 64)
    comp_rows: int = 64 * 1024  # compressed rows of the bf16 attention case
    fp8_comp_rows: int = 1 << 20  # 584 MiB of fp8 rows: random picks miss every cache
    fp8_batch: int = 64
    gemm_m: tuple[int, ...] = (1, 16, 128, 1024, 4096)
    fp8_nk: tuple[int, int] = (4096, 7168)  # q / o projections
    mxfp4_nk: tuple[int, int] = (2048, 7168)  # one routed expert
    moe: tuple[int, int, int, int] = (256, 6, 4096, 2048)  # experts, top-k, dim, inter
    moe_tokens: tuple[int, ...] = (1, 64, 128, 1024, 4096)

    @property
    def csa_width(self) -> int:
        return 2 * self.d  # the CSA compressor's overlapping kv / score width


FLASH = Shapes()


def do_bench_ms(fn: Callable[[], object]) -> float:
    """Median ms of ``fn`` by ``triton.testing.do_bench`` after one untimed call with the value checks on."""
    import triton.testing

    fn()  # compile + validate once, with the value checks on
    with value_checks_off():
        return float(triton.testing.do_bench(fn, warmup=25, rep=100))


def _row(name: str, ms: float, nbytes: int | None = None, per: int | None = None) -> dict:
    out = {"kernel": name, "ms": round(ms, 4)}
    if nbytes is not None:
        out["GB/s"] = round(nbytes / ms / 1e6, 1)
    if per:
        out["us_per_token"] = round(ms * 1e3 / per, 3)
    return out


def _table(num_seqs: int, max_blocks: int, dev: str) -> torch.Tensor:
    return torch.randperm(num_seqs * max_blocks, device=dev).view(num_seqs, max_blocks).to(torch.int32)


def _decode_tokens(sh: Shapes, dev: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(table [n, 16], seq_idx, positions)`` of ``sh.write_tokens`` decoding sequences at position 1000."""
    n = sh.write_tokens
    return (_table(n, 16, dev), torch.arange(n, dtype=torch.int32, device=dev),
            torch.full((n,), min(1000, 16 * sh.block - 1), dtype=torch.int32, device=dev))


def bench_swa_write(dev: str, sh: Shapes, time_ms: Timer) -> list[dict]:
    from .swa_write import swa_write

    rows = torch.empty(16 * sh.write_tokens * sh.row_stride, sh.d, dtype=torch.bfloat16, device=dev)
    tab, seq, pos = _decode_tokens(sh, dev)
    k = torch.randn(sh.write_tokens, sh.d, dtype=torch.bfloat16, device=dev)
    kw = dict(block_size=sh.block, row_stride=sh.row_stride)
    out = [_row(f"swa_write decode {sh.write_tokens} tok bf16[{sh.d}]",
                time_ms(lambda: swa_write(k, rows, tab, seq, pos, **kw)), 2 * k.numel() * 2)]
    n, t = sh.prefill
    kp = torch.randn(n * t, sh.d, dtype=torch.bfloat16, device=dev)
    pseq = torch.arange(n, dtype=torch.int32, device=dev).repeat_interleave(t)
    ppos = (torch.arange(n * t, device=dev) % t).to(torch.int32)
    out.append(_row(f"swa_write prefill {n}x{t} tok bf16[{sh.d}]",
                    time_ms(lambda: swa_write(kp, rows, tab, pseq, ppos, **kw)), 2 * kp.numel() * 2))
    return out


def bench_compressor_state(dev: str, sh: Shapes, time_ms: Timer) -> list[dict]:
    from . import compressor_state as cs

    seqs, chunk, width = sh.seqs, sh.chunk, sh.csa_width
    kv, score = (torch.randn(seqs * chunk, width, device=dev) for _ in range(2))
    ape = torch.randn(4, width, device=dev)
    cu = torch.arange(0, (seqs + 1) * chunk, chunk, dtype=torch.int32, device=dev)
    start = torch.zeros(seqs, dtype=torch.int32, device=dev)
    slots = torch.arange(seqs, dtype=torch.int32, device=dev)
    kvs, ss = (torch.empty(seqs, 8, width, device=dev) for _ in range(2))
    blocks = -(-chunk // sh.block)
    dst = [torch.empty(seqs * blocks, 4, width, device=dev) for _ in range(2)]
    tab = _table(seqs, blocks, dev)
    row_bytes = width * 4
    res = [_row(f"compressor_state_update {seqs} seq, ring 8, fp32[{width}]",
                time_ms(lambda: cs.compressor_state_update(kv, score, ape, kvs, ss, slots, cu, start)),
                seqs * 8 * row_bytes * 5)]  # kv + score + ape read, kv + score written
    res.append(_row(f"csa_boundary_capture {seqs} seq x {blocks} blocks",
                    time_ms(lambda: cs.csa_boundary_capture(kv, score, ape, *dst, tab, cu, start,
                                                            block_size=sh.block)),
                    seqs * blocks * 4 * row_bytes * 5))
    src = tab[:, blocks - 1].contiguous()
    resume = torch.full((seqs,), blocks * sh.block, dtype=torch.int32, device=dev)
    res.append(_row(f"csa_boundary_restore {seqs} seq",
                    time_ms(lambda: cs.csa_boundary_restore(*dst, kvs, ss, src, slots, resume)),
                    seqs * 4 * row_bytes * 4))
    return res


def bench_hca_state(dev: str, sh: Shapes, time_ms: Timer) -> list[dict]:
    from .hca_state import hca_state_update

    seqs, chunk, width = sh.seqs, sh.chunk, sh.d
    kv, score, pooled = (torch.randn(seqs * chunk, width, device=dev) for _ in range(3))
    ape = torch.zeros(128, width, device=dev)
    cu = torch.arange(0, (seqs + 1) * chunk, chunk, dtype=torch.int32, device=dev)
    start = torch.zeros(seqs, dtype=torch.int32, device=dev)
    slots = torch.arange(seqs, dtype=torch.int32, device=dev)
    acc = torch.empty(seqs, 3, width, device=dev)
    moved = seqs * chunk * width * 4 * 3  # kv + score read, ape re-read per token, pooled rows (1/128) ignored
    return [_row(f"hca_state_update {seqs} seq x {chunk} tok, ratio 128, fp32[{width}]",
                 time_ms(lambda: hca_state_update(kv, score, ape, acc, slots, cu, start, pooled)), moved)]


def bench_index(dev: str, sh: Shapes, time_ms: Timer) -> list[dict]:
    from .paged_index import build_comp_index, build_window_index

    n, ctx = sh.index_tokens, sh.contexts[-1]
    seq = torch.arange(n, dtype=torch.int32, device=dev) % 8
    pos = torch.full((n,), ctx - 1, dtype=torch.int32, device=dev)
    swa, comp = _table(8, ctx // sh.block, dev), _table(8, ctx // sh.block, dev)
    topk = torch.randint(0, ctx // 4, (n, sh.topk), dtype=torch.int32, device=dev)
    res = [_row(f"build_window_index {n} tok, W {sh.window}",
                time_ms(lambda: build_window_index(swa, seq, pos, window=sh.window, block_size=sh.block,
                                                   row_stride=sh.row_stride)), n * sh.window * 8)]
    res.append(_row(f"build_comp_index c4 {n} tok, top-k {sh.topk}",
                    time_ms(lambda: build_comp_index(comp, seq, pos, topk, width=sh.topk, ratio=4,
                                                     entries_per_block=sh.block // 4, pages_per_chunk=7,
                                                     chunk_rows=7 * sh.block // 4)), n * sh.topk * 12))
    res.append(_row(f"build_comp_index hca {n} tok, {ctx // 1024}K ctx ({ctx // 128} entries)",
                    time_ms(lambda: build_comp_index(comp, seq, pos, None, width=ctx // 128, ratio=128,
                                                     entries_per_block=1, pages_per_chunk=1, chunk_rows=1)),
                    n * (ctx // 128) * 8))
    return res


def bench_attention(dev: str, sh: Shapes, time_ms: Timer) -> list[dict]:
    from .sparse_attention import sparse_attention

    res = []
    wrows = torch.randn(64 * sh.row_stride, sh.d, dtype=torch.bfloat16, device=dev)
    crows = torch.randn(sh.comp_rows, sh.d, dtype=torch.bfloat16, device=dev)
    sink = torch.randn(sh.heads, device=dev)
    for ctx in sh.contexts:
        for group, kc in (("c4", sh.topk), ("hca", ctx // 128)):
            for tokens in sh.batches:
                q = torch.randn(tokens, sh.heads, sh.d, dtype=torch.bfloat16, device=dev)
                widx = torch.randint(0, wrows.shape[0], (tokens, sh.window), dtype=torch.int32, device=dev)
                cidx = torch.randint(0, crows.shape[0], (tokens, kc), dtype=torch.int32, device=dev)
                ms = time_ms(lambda: sparse_attention(q, wrows, widx, crows, cidx, sink, scale=sh.d ** -0.5))
                res.append(_row(f"sparse decode attn {group} ctx {ctx // 1024}K, batch {tokens}", ms,
                                tokens * (sh.window + kc) * sh.d * 2, per=tokens))
    return res


def bench_fp8_rows(dev: str, sh: Shapes, time_ms: Timer) -> list[dict]:
    """fp8_ds_mla rows: encode-on-write decode ``swa_write`` and decode attention reading byte rows."""
    from .fp8_ds_mla import DSV4_LAYOUT, fp8_ds_mla_quantize
    from .sparse_attention import sparse_attention
    from .swa_write import swa_write

    rb = DSV4_LAYOUT.row_bytes
    rows = torch.empty(16 * sh.write_tokens * sh.row_stride, rb, dtype=torch.uint8, device=dev)
    tab, seq, pos = _decode_tokens(sh, dev)
    k = torch.randn(sh.write_tokens, sh.d, dtype=torch.bfloat16, device=dev)
    res = [_row(f"swa_write decode {sh.write_tokens} tok fp8_ds_mla (encode on write)",
                time_ms(lambda: swa_write(k, rows, tab, seq, pos, block_size=sh.block, row_stride=sh.row_stride,
                                          codec=DSV4_LAYOUT)), k.numel() * 2 + sh.write_tokens * rb)]
    n_comp = sh.fp8_comp_rows
    crows = torch.empty(n_comp, rb, dtype=torch.uint8, device=dev)
    step = min(n_comp, 1 << 16)
    for i in range(0, n_comp, step):
        fp8_ds_mla_quantize(torch.randn(step, sh.d, dtype=torch.bfloat16, device=dev), crows[i:i + step])
    wrows = crows[: min(n_comp, 64 * sh.row_stride)]
    sink = torch.randn(sh.heads, device=dev)
    ctx, tokens = sh.contexts[-1], sh.fp8_batch
    for group, kc in (("c4", sh.topk), ("hca", ctx // 128)):
        q = torch.randn(tokens, sh.heads, sh.d, dtype=torch.bfloat16, device=dev)
        widx = torch.randint(0, wrows.shape[0], (tokens, sh.window), dtype=torch.int32, device=dev)
        cidx = torch.randint(0, n_comp, (tokens, kc), dtype=torch.int32, device=dev)
        ms = time_ms(lambda: sparse_attention(q, wrows, widx, crows, cidx, sink, scale=sh.d ** -0.5,
                                              codec=DSV4_LAYOUT))
        res.append(_row(f"sparse decode attn fp8_ds_mla {group} ctx {ctx // 1024}K, batch {tokens}", ms,
                        tokens * (sh.window + kc) * rb, per=tokens))
    return res


def _e8m0(shape: tuple[int, ...], dev: str) -> torch.Tensor:
    """Random power-of-two scales 2^-4 .. 2^3 as e8m0 bytes (exponent + 127)."""
    return torch.randint(123, 131, shape, dtype=torch.uint8, device=dev).view(torch.float8_e8m0fnu)


def _random_fp8_weight(n: int, k: int, dev: str, lead: tuple[int, ...] = ()) -> tuple[torch.Tensor, torch.Tensor]:
    """An e4m3 ``[*lead, n, k]`` weight with one scale per 128 x 128 block (timing only: values are random)."""
    w = (torch.randn(*lead, n, k, device=dev) * 64).to(torch.float8_e4m3fn)
    return w, _e8m0((*lead, -(-n // 128), -(-k // 128)), dev)


def _random_mxfp4_weight(n: int, k: int, dev: str, lead: tuple[int, ...] = ()) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed e2m1 pairs ``[*lead, n, k / 2]`` (any byte is two valid codes) with one scale per 32 inputs."""
    return (torch.randint(0, 256, (*lead, n, k // 2), dtype=torch.uint8, device=dev),
            _e8m0((*lead, n, k // 32), dev))


def bench_gemm(dev: str, sh: Shapes, time_ms: Timer) -> list[dict]:
    """Quantized GEMMs at V4-Flash shapes: q/o projections (FP8) and one routed expert (MXFP4)."""
    from .fp8_gemm import fp8_block_gemm
    from .mxfp4_gemm import mxfp4_gemm

    res = []
    cases = (("fp8_block_gemm", fp8_block_gemm, _random_fp8_weight, sh.fp8_nk, 1.0),
             ("mxfp4_gemm", mxfp4_gemm, _random_mxfp4_weight, sh.mxfp4_nk, 0.5 + 1 / 32))
    for name, kernel, make_weight, (n, k), bytes_per_weight in cases:
        w, s = make_weight(n, k, dev)
        dense = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
        for m in sh.gemm_m:
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            flop = 2 * m * n * k
            for label, fn, wbytes in ((name, lambda: kernel(x, w, s), n * k * bytes_per_weight),
                                      ("bf16 matmul", lambda: x @ dense.T, n * k * 2)):
                res.append(_flops_row(f"{label} M={m} N={n} K={k}", time_ms(fn), flop, wbytes))
    return res + _bench_w8a8(dev, sh, time_ms) + bench_moe(dev, sh, time_ms)


def _flops_row(name: str, ms: float, flop: int, weight_bytes: float) -> dict:
    return {"kernel": name, "ms": round(ms, 4), "TFLOP/s": round(flop / ms / 1e9, 2),
            "GB/s": round(weight_bytes / ms / 1e6, 1)}


def _bench_w8a8(dev: str, sh: Shapes, time_ms: Timer) -> list[dict]:
    """The W8A8 GEMM at the FP8 case's shape: the GEMM on FP8 activations, and with their quantization first
    (``fp8_act_quant``, what a linear not fed by a fused norm launches)."""
    from .act_quant import fp8_act_quant
    from .w8a8_gemm import w8a8_block_gemm

    n, k = sh.fp8_nk
    w, s = _random_fp8_weight(n, k, dev)
    res = []
    for m in sh.gemm_m:
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        xq, xs = fp8_act_quant(x, 128)
        for label, fn in (("w8a8_block_gemm", lambda: w8a8_block_gemm(xq, xs, w, s, torch.bfloat16)),
                          ("fp8_act_quant + w8a8_block_gemm",
                           lambda: w8a8_block_gemm(*fp8_act_quant(x, 128), w, s, torch.bfloat16))):
            res.append(_flops_row(f"{label} M={m} N={n} K={k}", time_ms(fn), 2 * m * n * k, n * k))
    return res


def bench_moe(dev: str, sh: Shapes, time_ms: Timer) -> list[dict]:
    """``fused_moe`` with FP8 experts (activations rounded to FP8 blocks of 128, the release numerics) and MXFP4
    experts (bf16 activations), uniformly random top-k routing: TFLOP/s of the pairs' three GEMMs
    (``6 x pairs x dim x inter``) and GB/s of the expert weights the routing touches."""
    from .fused_moe import fused_moe

    e, top, d, inter = sh.moe
    gen = torch.Generator(device=dev).manual_seed(0)
    res = []
    cases = (("fp8 (fp8 activations)", _random_fp8_weight, 1.0, (128, 128)),
             ("mxfp4", _random_mxfp4_weight, 0.5 + 1 / 32, (0, 0)))
    for label, make_weight, bytes_per_weight, blocks in cases:
        (w1, s1), (w3, s3) = make_weight(inter, d, dev, (e,)), make_weight(inter, d, dev, (e,))
        w2, s2 = make_weight(d, inter, dev, (e,))
        for t in sh.moe_tokens:
            x = torch.randn(t, d, device=dev, dtype=torch.bfloat16)
            idx = torch.rand(t, e, device=dev, generator=gen).topk(top, dim=1).indices.to(torch.int32)
            route_w = torch.rand(t, top, device=dev, generator=gen)
            experts = int(torch.unique(idx).numel())  # untimed: the weight bytes the step reads
            ms = time_ms(lambda: fused_moe(x, route_w, idx, w1, w3, w2, s1, s3, s2, limit=10.0, act_blocks=blocks))
            res.append(_flops_row(f"fused_moe {label} E={e} top-{top} D={d} I={inter} T={t}", ms,
                                  6 * t * top * d * inter, 3 * experts * d * inter * bytes_per_weight))
    return res


KV_BENCHES = (bench_swa_write, bench_compressor_state, bench_hca_state, bench_index, bench_attention, bench_fp8_rows)


def run(gemm: bool, dev: str, sh: Shapes = FLASH, time_ms: Timer = do_bench_ms) -> list[dict]:
    """The rows of the ``--gemm`` cases (GEMMs, W8A8, fused MoE) or of the KV / attention cases."""
    rows = []
    for bench in (bench_gemm,) if gemm else KV_BENCHES:
        rows += bench(dev, sh, time_ms)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", help="also write the rows to this JSON file")
    parser.add_argument("--gemm", action="store_true",
                        help="time the quantized-weight GEMMs and the fused MoE (TFLOP/s) instead")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_kernels needs a CUDA or ROCm GPU (torch.cuda.is_available() is False); nothing measured",
              file=sys.stderr)
        return 2
    rows = run(args.gemm, "cuda")
    print(f"device: {torch.cuda.get_device_name()}")
    if args.gemm:
        print("| kernel | ms | TFLOP/s | weight GB/s |\n|---|---|---|---|")
        for r in rows:
            print(f"| {r['kernel']} | {r['ms']} | {r['TFLOP/s']} | {r['GB/s']} |")
    else:
        print("| kernel | ms | GB/s | us/token |\n|---|---|---|---|")
        for r in rows:
            print(f"| {r['kernel']} | {r['ms']} | {r.get('GB/s', '')} | {r.get('us_per_token', '')} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
