"""The compiled W8A8 GEMM and FP8 activation quantizers against their torch references on a GPU at DeepSeek-V4-Flash
shapes (sm90: FP8 wgmma; gfx942: e4m3fnuz MFMA; gfx950: OCP FP8 MFMA), and aiter's ``gemm_a8w8_blockscale`` behind
the same op on ROCm.

Skipped on machines without CUDA/ROCm. Run alone (``pytest tests/gpu``) so the kernels are compiled, not
interpreted.
"""

import pytest
import torch

from atom.kernels.act_quant import dequantize_act, fp8_act_quant, fp8_act_quant_ref, rms_norm_fp8
from atom.kernels.backend import aiter_available
from atom.kernels.w8a8_gemm import w8a8_block_gemm, w8a8_block_gemm_ref
from atom.models.deepseek_v4.quant import dequantize_fp8_weight, quantize_fp8_weight
from support.gpu import gpu_module_marks

pytestmark = gpu_module_marks("tests/kernels/test_kernel_w8a8_gemm.py covers the same kernels in the interpreter")


def _operands(m: int, n: int, k: int):
    gen = torch.Generator().manual_seed(11)
    w, s = (t.cuda() for t in quantize_fp8_weight(torch.randn(n, k, generator=gen) * 0.02))
    x = torch.randn(m, k, generator=gen).to("cuda", torch.bfloat16)
    return x, w, s


def _bound(xq, xs, w, s) -> torch.Tensor:
    """Hopper's FP8 MMA keeps fewer bits than fp32 inside one K step: a loose 2^-12 of ``sum_k |x_k w_k|``."""
    xabs = dequantize_act(xq, xs).abs()
    return 2.0**-12 * (xabs @ dequantize_fp8_weight(w, s).abs().T)


@pytest.mark.parametrize("m", [1, 64, 300])
@pytest.mark.parametrize("n,k", [(1024, 4096), (4096, 1024)], ids=["wq_a", "wo_b-like"])
def test_the_compiled_w8a8_gemm_matches_the_reference_at_flash_shapes(compiled_triton_only, m, n, k):
    x, w, s = _operands(m, n, k)
    xq, xs = fp8_act_quant(x, 128)
    want_q, want_s = fp8_act_quant_ref(x, 128)
    assert torch.equal(xq.view(torch.uint8), want_q.view(torch.uint8)) and torch.equal(xs, want_s)
    got = w8a8_block_gemm(xq, xs, w, s, torch.float32)
    want = w8a8_block_gemm_ref(xq, xs, w, s, torch.float32)
    assert bool(((got - want).abs() <= _bound(xq, xs, w, s) + 1e-6).all())


def test_the_compiled_fused_norm_quantizes_its_own_output(compiled_triton_only):
    x, _, _ = _operands(64, 8, 4096)
    weight = torch.rand(4096, device="cuda").to(torch.bfloat16) + 0.5
    y, xq, xs = rms_norm_fp8(x, weight, 1e-6, 128)
    want_q, want_s = fp8_act_quant_ref(y, 128)
    assert torch.equal(xq.view(torch.uint8), want_q.view(torch.uint8)) and torch.equal(xs, want_s)


@pytest.mark.skipif(not aiter_available(), reason="needs aiter (ROCm): `import aiter` fails on this machine")
def test_the_aiter_w8a8_gemm_matches_the_reference():
    from atom.kernels.aiter_gemm import w8a8_block_gemm_aiter

    x, w, s = _operands(64, 4096, 7168)
    xq, xs = fp8_act_quant_ref(x, 128)
    got = w8a8_block_gemm_aiter(xq, xs, w, s, torch.bfloat16).float()
    torch.testing.assert_close(got, w8a8_block_gemm_ref(xq, xs, w, s, torch.bfloat16).float(), rtol=2e-2, atol=2e-2)
