"""Row-parallel quantized layers over 2 gloo ranks with ``quant_sim`` (FP8 inputs of every quantized GEMM):
an FP8 input block that spans both ranks' columns rounds exactly as on one rank (the ranks exchange the
block's maxima), and the layers' outputs equal the unsplit ones within 1e-5 relative (only the order of
the all-reduce's sum differs)."""

from __future__ import annotations

import pytest
import torch

from atom.models.deepseek_v4.loader import load_checkpoint
from atom.models.deepseek_v4.make_tiny_checkpoint import make_tiny_checkpoint
from support.parallel_ranks import CFG, quantized_inputs, quantized_layers, quantized_layers_rank, run_ranks

pytestmark = pytest.mark.slow


def test_split_fp8_input_blocks_round_as_on_one_rank_and_the_layers_match(tmp_path):
    path = make_tiny_checkpoint(tmp_path, fp8=True)
    got = {rank: [torch.from_numpy(a) for a in out]
           for rank, out in run_ranks(quantized_layers_rank, (str(path),), results=2, timeout=120)}
    full = load_checkpoint(path, quant_sim=True)
    x, o, tokens = quantized_inputs(CFG.o_groups * CFG.o_lora_rank)
    with torch.no_grad():
        want = quantized_layers(full, x, o, tokens)
    half = o.shape[1] // 2
    assert full.layers[3].attn.wo_b.act_block == 2 * half  # one FP8 block over both ranks' columns
    assert torch.equal(torch.cat([got[0][0], got[1][0]], dim=1), want[0])
    for rank in range(2):
        for g, w in zip(got[rank][1:], want[1:]):
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5 * float(w.abs().max()))
