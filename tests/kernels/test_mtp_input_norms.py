"""The MTP block's input norms on a GPU backend (the Triton kernel set, under the interpreter): ``enorm`` and
``hnorm`` run the fused norm kernel like the block's own norms, and when ``e_proj`` / ``h_proj`` run W8A8 they
quantize for them in the same launch (``rms_norm_fp8``), so no linear quantizes its input again. The result
equals the torch arithmetic's (the reference's) within the FP8 rounding of one activation block."""

import torch

from atom.bench.kernel_count import KernelCounter
from atom.kernels.backend import load_kernels
from atom.models.deepseek_v4.checkpoint import random_state_dict
from atom.models.deepseek_v4.config import DeepseekV4Config
from atom.models.deepseek_v4_serving import DeepseekV4ForServing


def mtp_block(fp8_projections: bool):
    cfg = DeepseekV4Config.tiny()
    model = DeepseekV4ForServing(cfg)
    model.load_state_dict(random_state_dict(cfg, seed=5))
    block = model.mtp[0].eval()
    if fp8_projections:
        gen = torch.Generator().manual_seed(1)
        for lin in (block.e_proj, block.h_proj):
            lin.set_format("fp8", act_quant=True)
            lin.weight.data = (torch.randn(lin.weight.shape, generator=gen) * 4).to(torch.float8_e4m3fn)
            lin.scale.data = torch.randint(118, 122, lin.scale.shape, generator=gen,
                                           dtype=torch.uint8).view(torch.float8_e8m0fnu)
    return block


def inputs(block):
    gen = torch.Generator().manual_seed(2)
    dim = block.enorm.weight.shape[0]
    return torch.randn(3, block.cfg.hc_mult, dim, generator=gen), torch.randn(3, dim, generator=gen)


def test_w8a8_projections_take_the_fp8_rows_their_norms_made_in_the_same_launch():
    block = mtp_block(fp8_projections=True)
    h, emb = inputs(block)
    with torch.no_grad():
        want = block.mtp_input(h, emb)  # no kernel set bound: the torch arithmetic, weight-only FP8 GEMMs
    kernels = load_kernels("triton")
    for lin in (block.e_proj, block.h_proj):
        lin.bind_gemm(kernels)
        assert lin.w8a8 is not None
    block.bind_small_ops(kernels)  # after the GEMMs, as the serving model binds them
    with torch.no_grad(), KernelCounter() as count:
        got = block.mtp_input(h, emb)
    assert (block.enorm.fp8_block, block.hnorm.fp8_block) == (block.e_proj.act_block, block.h_proj.act_block)
    assert block.enorm.fp8_block > 0
    # enorm + hnorm (each rms_norm_fp8), e_proj + h_proj (each w8a8_block_gemm); the broadcast add of the two
    assert count.triton == 4 and dict(count.aten) == {"add": 1}
    torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5 * float(want.abs().max()))


def test_dense_projections_get_the_plain_fused_norm():
    block = mtp_block(fp8_projections=False)
    h, emb = inputs(block)
    with torch.no_grad():
        want = block.mtp_input(h, emb)
    block.bind_small_ops(load_kernels("triton"))
    with torch.no_grad(), KernelCounter() as count:
        got = block.mtp_input(h, emb)
    assert (block.enorm.fp8_block, block.hnorm.fp8_block) == (0, 0)
    assert count.triton == 2 and count.aten["mm"] == 2  # two rms_norm launches; the two dense GEMMs
    torch.testing.assert_close(got, want, rtol=2e-6, atol=2e-6 * float(want.abs().max()))
