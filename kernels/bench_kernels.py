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
  next to a bf16 ``torch.matmul`` of the same shape, and the W8A8 GEMM (``w8a8_block_gemm``, FP8 activations)
  alone and after ``fp8_act_quant``.

Value checks are switched off inside the timed calls (:func:`value_checks_off`): they sync the device
and were run once, untimed, on the same inputs. It needs a GPU; without one it prints why and exits
with status 2 without reporting any number.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Callable

import torch

from ._common import value_checks_off

BS, ROW_STRIDE, WINDOW, D, H, TOPK, CSA_WIDTH = 128, 224, 128, 512, 64, 512, 2 * 512


def _time_ms(fn: Callable[[], object]) -> float:
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


def bench_swa_write(dev: str) -> list[dict]:
    from .swa_write import swa_write

    rows = torch.empty(4096 * ROW_STRIDE, D, dtype=torch.bfloat16, device=dev)
    tab = _table(256, 16, dev)
    k = torch.randn(256, D, dtype=torch.bfloat16, device=dev)
    seq = torch.arange(256, dtype=torch.int32, device=dev)
    pos = torch.full((256,), 1000, dtype=torch.int32, device=dev)
    out = [_row("swa_write decode 256 tok bf16[512]",
                _time_ms(lambda: swa_write(k, rows, tab, seq, pos, block_size=BS, row_stride=ROW_STRIDE)),
                2 * k.numel() * 2)]
    kp = torch.randn(16 * 1024, D, dtype=torch.bfloat16, device=dev)
    pseq = torch.arange(16, dtype=torch.int32, device=dev).repeat_interleave(1024)
    ppos = (torch.arange(16 * 1024, device=dev) % 1024).to(torch.int32)
    out.append(_row("swa_write prefill 16x1024 tok bf16[512]",
                    _time_ms(lambda: swa_write(kp, rows, tab, pseq, ppos, block_size=BS, row_stride=ROW_STRIDE)),
                    2 * kp.numel() * 2))
    return out


def bench_compressor_state(dev: str) -> list[dict]:
    from . import compressor_state as cs

    seqs, chunk = 64, 512
    kv, score = (torch.randn(seqs * chunk, CSA_WIDTH, device=dev) for _ in range(2))
    ape = torch.randn(4, CSA_WIDTH, device=dev)
    cu = torch.arange(0, (seqs + 1) * chunk, chunk, dtype=torch.int32, device=dev)
    start = torch.zeros(seqs, dtype=torch.int32, device=dev)
    slots = torch.arange(seqs, dtype=torch.int32, device=dev)
    kvs, ss = (torch.empty(seqs, 8, CSA_WIDTH, device=dev) for _ in range(2))
    dst = [torch.empty(seqs * 4, 4, CSA_WIDTH, device=dev) for _ in range(2)]
    tab = _table(seqs, 4, dev)
    row_bytes = CSA_WIDTH * 4
    res = [_row("compressor_state_update 64 seq, ring 8, fp32[1024]",
                _time_ms(lambda: cs.compressor_state_update(kv, score, ape, kvs, ss, slots, cu, start)),
                seqs * 8 * row_bytes * 5)]  # kv + score + ape read, kv + score written
    res.append(_row("csa_boundary_capture 64 seq x 4 blocks",
                    _time_ms(lambda: cs.csa_boundary_capture(kv, score, ape, *dst, tab, cu, start, block_size=BS)),
                    seqs * 4 * 4 * row_bytes * 5))
    src = tab[:, 3].contiguous()
    resume = torch.full((seqs,), 4 * BS, dtype=torch.int32, device=dev)
    res.append(_row("csa_boundary_restore 64 seq",
                    _time_ms(lambda: cs.csa_boundary_restore(*dst, kvs, ss, src, slots, resume)),
                    seqs * 4 * row_bytes * 4))
    return res


def bench_hca_state(dev: str) -> list[dict]:
    from .hca_state import hca_state_update

    seqs, chunk, width = 64, 512, D
    kv, score, pooled = (torch.randn(seqs * chunk, width, device=dev) for _ in range(3))
    ape = torch.zeros(128, width, device=dev)
    cu = torch.arange(0, (seqs + 1) * chunk, chunk, dtype=torch.int32, device=dev)
    start = torch.zeros(seqs, dtype=torch.int32, device=dev)
    slots = torch.arange(seqs, dtype=torch.int32, device=dev)
    acc = torch.empty(seqs, 3, width, device=dev)
    moved = seqs * chunk * width * 4 * 3  # kv + score read, ape re-read per token, pooled rows (1/128) ignored
    return [_row("hca_state_update 64 seq x 512 tok, ratio 128, fp32[512]",
                 _time_ms(lambda: hca_state_update(kv, score, ape, acc, slots, cu, start, pooled)), moved)]


def bench_index(dev: str) -> list[dict]:
    from .paged_index import build_comp_index, build_window_index

    n, ctx = 256, 128 * 1024
    seq = torch.arange(n, dtype=torch.int32, device=dev) % 8
    pos = torch.full((n,), ctx - 1, dtype=torch.int32, device=dev)
    swa, comp = _table(8, ctx // BS, dev), _table(8, ctx // BS, dev)
    topk = torch.randint(0, ctx // 4, (n, TOPK), dtype=torch.int32, device=dev)
    res = [_row("build_window_index 256 tok, W 128",
                _time_ms(lambda: build_window_index(swa, seq, pos, window=WINDOW, block_size=BS,
                                                    row_stride=ROW_STRIDE)), n * WINDOW * 8)]
    res.append(_row("build_comp_index c4 256 tok, top-k 512",
                    _time_ms(lambda: build_comp_index(comp, seq, pos, topk, width=TOPK, ratio=4, entries_per_block=32,
                                                      pages_per_chunk=7, chunk_rows=224)), n * TOPK * 12))
    res.append(_row("build_comp_index hca 256 tok, 128K ctx (1024 entries)",
                    _time_ms(lambda: build_comp_index(comp, seq, pos, None, width=ctx // 128, ratio=128,
                                                      entries_per_block=1, pages_per_chunk=1, chunk_rows=1)),
                    n * (ctx // 128) * 8))
    return res


def bench_attention(dev: str) -> list[dict]:
    from .sparse_attention import sparse_attention

    res = []
    wrows = torch.randn(64 * ROW_STRIDE, D, dtype=torch.bfloat16, device=dev)
    crows = torch.randn(64 * 1024, D, dtype=torch.bfloat16, device=dev)
    sink = torch.randn(H, device=dev)
    for ctx in (8 * 1024, 128 * 1024):
        for group, kc in (("c4", TOPK), ("hca", ctx // 128)):
            for tokens in (1, 64):
                q = torch.randn(tokens, H, D, dtype=torch.bfloat16, device=dev)
                widx = torch.randint(0, wrows.shape[0], (tokens, WINDOW), dtype=torch.int32, device=dev)
                cidx = torch.randint(0, crows.shape[0], (tokens, kc), dtype=torch.int32, device=dev)
                ms = _time_ms(lambda: sparse_attention(q, wrows, widx, crows, cidx, sink, scale=D ** -0.5))
                res.append(_row(f"sparse decode attn {group} ctx {ctx // 1024}K, batch {tokens}", ms,
                                tokens * (WINDOW + kc) * D * 2, per=tokens))
    return res


def _e8m0(shape: tuple[int, ...], dev: str) -> torch.Tensor:
    """Random power-of-two scales 2^-4 .. 2^3 as e8m0 bytes (exponent + 127)."""
    return torch.randint(123, 131, shape, dtype=torch.uint8, device=dev).view(torch.float8_e8m0fnu)


def _random_fp8_weight(n: int, k: int, dev: str) -> tuple[torch.Tensor, torch.Tensor]:
    """An e4m3 ``[n, k]`` weight with one scale per 128 x 128 block (timing only: values are random)."""
    w = (torch.randn(n, k, device=dev) * 64).to(torch.float8_e4m3fn)
    return w, _e8m0((-(-n // 128), -(-k // 128)), dev)


def _random_mxfp4_weight(n: int, k: int, dev: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed e2m1 pairs ``[n, k / 2]`` (any byte is two valid codes) with one scale per 32 inputs."""
    return torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device=dev), _e8m0((n, k // 32), dev)


def bench_gemm(dev: str) -> list[dict]:
    """Quantized GEMMs at V4-Flash shapes: q/o projections (FP8) and one routed expert (MXFP4)."""
    from .fp8_gemm import fp8_block_gemm
    from .mxfp4_gemm import mxfp4_gemm

    res = []
    cases = (("fp8_block_gemm", fp8_block_gemm, _random_fp8_weight, (4096, 7168), 1.0),
             ("mxfp4_gemm", mxfp4_gemm, _random_mxfp4_weight, (2048, 7168), 0.5 + 1 / 32))
    for name, kernel, make_weight, (n, k), bytes_per_weight in cases:
        w, s = make_weight(n, k, dev)
        dense = torch.randn(n, k, device=dev, dtype=torch.bfloat16)
        for m in (1, 16, 128, 1024, 4096):
            x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
            flop = 2 * m * n * k
            for label, fn, wbytes in ((name, lambda: kernel(x, w, s), n * k * bytes_per_weight),
                                      ("bf16 matmul", lambda: x @ dense.T, n * k * 2)):
                ms = _time_ms(fn)
                res.append({"kernel": f"{label} M={m} N={n} K={k}", "ms": round(ms, 4),
                            "TFLOP/s": round(flop / ms / 1e9, 2), "GB/s": round(wbytes / ms / 1e6, 1)})
    res += _bench_w8a8(dev)
    return res


def _bench_w8a8(dev: str) -> list[dict]:
    """The W8A8 GEMM at the FP8 case's shape: the GEMM on FP8 activations, and with their quantization first
    (``fp8_act_quant``, what a linear not fed by a fused norm launches)."""
    from .act_quant import fp8_act_quant
    from .w8a8_gemm import w8a8_block_gemm

    n, k = 4096, 7168
    w, s = _random_fp8_weight(n, k, dev)
    res = []
    for m in (1, 16, 128, 1024, 4096):
        x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
        xq, xs = fp8_act_quant(x, 128)
        flop = 2 * m * n * k
        for label, fn in (("w8a8_block_gemm", lambda: w8a8_block_gemm(xq, xs, w, s, torch.bfloat16)),
                          ("fp8_act_quant + w8a8_block_gemm",
                           lambda: w8a8_block_gemm(*fp8_act_quant(x, 128), w, s, torch.bfloat16))):
            ms = _time_ms(fn)
            res.append({"kernel": f"{label} M={m} N={n} K={k}", "ms": round(ms, 4),
                        "TFLOP/s": round(flop / ms / 1e9, 2), "GB/s": round(n * k / ms / 1e6, 1)})
    return res
def bench_fp8_rows(dev: str) -> list[dict]:
    """fp8_ds_mla rows: encode-on-write decode ``swa_write`` and decode attention reading byte rows."""
    from .fp8_ds_mla import DSV4_LAYOUT, fp8_ds_mla_quantize
    from .sparse_attention import sparse_attention
    from .swa_write import swa_write

    rb = DSV4_LAYOUT.row_bytes
    rows = torch.empty(4096 * ROW_STRIDE, rb, dtype=torch.uint8, device=dev)
    tab = _table(256, 16, dev)
    k = torch.randn(256, D, dtype=torch.bfloat16, device=dev)
    seq = torch.arange(256, dtype=torch.int32, device=dev)
    pos = torch.full((256,), 1000, dtype=torch.int32, device=dev)
    res = [_row("swa_write decode 256 tok fp8_ds_mla (encode on write)",
                _time_ms(lambda: swa_write(k, rows, tab, seq, pos, block_size=BS, row_stride=ROW_STRIDE,
                                           codec=DSV4_LAYOUT)), k.numel() * 2 + 256 * rb)]
    n_comp = 1 << 20  # 584 MiB of compressed rows: random picks miss every cache
    crows = torch.empty(n_comp, rb, dtype=torch.uint8, device=dev)
    for i in range(0, n_comp, 1 << 16):
        fp8_ds_mla_quantize(torch.randn(1 << 16, D, dtype=torch.bfloat16, device=dev), crows[i:i + (1 << 16)])
    wrows = crows[: 64 * ROW_STRIDE]
    sink = torch.randn(H, device=dev)
    ctx, tokens = 128 * 1024, 64
    for group, kc in (("c4", TOPK), ("hca", ctx // 128)):
        q = torch.randn(tokens, H, D, dtype=torch.bfloat16, device=dev)
        widx = torch.randint(0, wrows.shape[0], (tokens, WINDOW), dtype=torch.int32, device=dev)
        cidx = torch.randint(0, n_comp, (tokens, kc), dtype=torch.int32, device=dev)
        ms = _time_ms(lambda: sparse_attention(q, wrows, widx, crows, cidx, sink, scale=D ** -0.5, codec=DSV4_LAYOUT))
        res.append(_row(f"sparse decode attn fp8_ds_mla {group} ctx {ctx // 1024}K, batch {tokens}", ms,
                        tokens * (WINDOW + kc) * rb, per=tokens))
    return res


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--json", help="also write the rows to this JSON file")
    parser.add_argument("--gemm", action="store_true", help="time the quantized-weight GEMMs (TFLOP/s) instead")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_kernels needs a CUDA or ROCm GPU (torch.cuda.is_available() is False); nothing measured",
              file=sys.stderr)
        return 2
    rows = []
    kv_benches = (bench_swa_write, bench_compressor_state, bench_hca_state, bench_index, bench_attention,
                  bench_fp8_rows)
    for bench in (bench_gemm,) if args.gemm else kv_benches:
        rows += bench("cuda")
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
