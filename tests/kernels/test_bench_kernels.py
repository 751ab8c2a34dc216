"""The kernel benchmark: without a GPU it says what it needs and reports no figure; at toy shapes every case
launches its kernels in the interpreter (the launches match the kernels' current signatures)."""

import pytest
import torch

from atom.kernels.bench_kernels import FLASH, Shapes, main, run

TOY = Shapes(heads=16, window=16, topk=16, block=16, row_stride=24, write_tokens=4, prefill=(2, 32), seqs=2,
             chunk=32, index_tokens=4, contexts=(1024,), batches=(1, 2), comp_rows=64, fp8_comp_rows=64, fp8_batch=2,
             gemm_m=(1, 3), fp8_nk=(256, 256), mxfp4_nk=(128, 256), moe=(8, 2, 256, 128), moe_tokens=(1, 3))


def one_call_is_one_ms(fn) -> float:
    """A timer for the interpreter run: one call (value checks on), reported as 1 ms so the rates are exact."""
    fn()
    return 1.0


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present: the benchmark measures there (run it)")
@pytest.mark.parametrize("argv", [[], ["--gemm"]], ids=["kv-kernels", "gemm"])
def test_without_a_gpu_the_kernel_benchmark_says_it_needs_one_and_prints_no_figure(argv, capsys):
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err == "bench_kernels needs a CUDA or ROCm GPU (torch.cuda.is_available() is False); nothing measured\n"


def test_the_default_shapes_are_v4_flash_with_batch_64_at_128k_context():
    assert (FLASH.d, FLASH.heads, FLASH.window, FLASH.topk, FLASH.contexts[-1], FLASH.fp8_batch) == (
        512, 64, 128, 512, 128 * 1024, 64)
    assert FLASH.moe == (256, 6, 4096, 2048) and 64 in FLASH.batches and 64 in FLASH.moe_tokens


def test_every_kv_and_attention_case_launches_at_toy_shapes_in_the_interpreter():
    rows = run(False, "cpu", TOY, one_call_is_one_ms)
    assert [r["kernel"] for r in rows] == [
        "swa_write decode 4 tok bf16[512]", "swa_write prefill 2x32 tok bf16[512]",
        "compressor_state_update 2 seq, ring 8, fp32[1024]", "csa_boundary_capture 2 seq x 2 blocks",
        "csa_boundary_restore 2 seq", "hca_state_update 2 seq x 32 tok, ratio 128, fp32[512]",
        "build_window_index 4 tok, W 16", "build_comp_index c4 4 tok, top-k 16",
        "build_comp_index hca 4 tok, 1K ctx (8 entries)",
        "sparse decode attn c4 ctx 1K, batch 1", "sparse decode attn c4 ctx 1K, batch 2",
        "sparse decode attn hca ctx 1K, batch 1", "sparse decode attn hca ctx 1K, batch 2",
        "swa_write decode 4 tok fp8_ds_mla (encode on write)",
        "sparse decode attn fp8_ds_mla c4 ctx 1K, batch 2", "sparse decode attn fp8_ds_mla hca ctx 1K, batch 2"]
    attn = rows[-1]  # 2 tokens x (16 window + 8 HCA entries) rows of 584 bytes in 1 ms
    assert (attn["ms"], attn["GB/s"], attn["us_per_token"]) == (1.0, round(2 * 24 * 584 / 1e6, 1), 500.0)


def test_every_gemm_and_fused_moe_case_launches_at_toy_shapes_in_the_interpreter():
    rows = run(True, "cpu", TOY, one_call_is_one_ms)
    names = [r["kernel"] for r in rows]
    assert names[:4] == ["fp8_block_gemm M=1 N=256 K=256", "bf16 matmul M=1 N=256 K=256",
                         "fp8_block_gemm M=3 N=256 K=256", "bf16 matmul M=3 N=256 K=256"]
    assert names[8:12] == ["w8a8_block_gemm M=1 N=256 K=256", "fp8_act_quant + w8a8_block_gemm M=1 N=256 K=256",
                           "w8a8_block_gemm M=3 N=256 K=256", "fp8_act_quant + w8a8_block_gemm M=3 N=256 K=256"]
    assert names[12:] == [f"fused_moe {fmt} E=8 top-2 D=256 I=128 T={t}"
                          for fmt in ("fp8 (fp8 activations)", "mxfp4") for t in (1, 3)]
    moe = rows[13]  # T=3: 6 x 3 x 2 x 256 x 128 flop in 1 ms
    assert moe["TFLOP/s"] == round(6 * 3 * 2 * 256 * 128 / 1e9, 2)
