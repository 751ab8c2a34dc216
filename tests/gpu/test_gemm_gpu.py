"""Compiled quantized-weight GEMMs against their torch references on a GPU at DeepSeek-V4-Flash shapes.

Skipped on machines without CUDA/ROCm. Run alone (``pytest tests/gpu``) so the kernels are compiled, not
interpreted.
"""


import pytest
import torch

from atom.kernels.backend import aiter_available
from atom.kernels.fp8_gemm import fp8_block_gemm, fp8_block_gemm_ref
from atom.kernels.mxfp4_gemm import mxfp4_gemm, mxfp4_gemm_ref
from atom.models.deepseek_v4.quant import quantize_fp8_weight, quantize_mxfp4_weight
from support.gpu import gpu_module_marks

pytestmark = gpu_module_marks("tests/kernels/test_kernel_gemm.py covers the same kernels in the interpreter")



def _gen():
    return torch.Generator().manual_seed(7)


# (quantize, kernel, reference, weight shape): an attention / shared-expert linear and a routed expert of Flash
FORMATS = {"fp8": (quantize_fp8_weight, fp8_block_gemm, fp8_block_gemm_ref, (4096, 7168)),
           "mxfp4": (quantize_mxfp4_weight, mxfp4_gemm, mxfp4_gemm_ref, (2048, 7168))}


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("m", [1, 64, 300])
def test_the_compiled_gemm_matches_the_reference_at_flash_shapes(fmt, m, dtype):
    quantize, kernel, reference, shape = FORMATS[fmt]
    w, s = (t.cuda() for t in quantize(torch.randn(shape, generator=_gen()) * 0.02))
    x = torch.randn(m, shape[1], generator=_gen()).to("cuda", dtype)
    tol = dict(rtol=2e-2, atol=2e-2) if dtype == torch.bfloat16 else dict(rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(kernel(x, w, s).float(), reference(x, w, s).float(), **tol)


@pytest.mark.skipif(not aiter_available(),
                    reason="needs aiter (ROCm): `import aiter` fails on this machine")
def test_the_aiter_fp8_gemm_matches_the_reference():
    from atom.kernels.aiter_gemm import fp8_block_gemm_aiter

    w, s = (t.cuda() for t in quantize_fp8_weight(torch.randn(4096, 7168, generator=_gen()) * 0.02))
    x = torch.randn(64, 7168, generator=_gen()).to("cuda", torch.bfloat16)
    torch.testing.assert_close(fp8_block_gemm_aiter(x, w, s).float(), fp8_block_gemm_ref(x, w, s).float(),
                               rtol=2e-2, atol=2e-2)
