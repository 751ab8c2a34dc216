"""Tensor and expert parallelism over NCCL on 2 GPUs: the vocab-parallel embedding and head and
tensor- or expert-parallel MoE layers (hash- and score-routed) on ``cuda:0`` + ``cuda:1`` against
the unsharded model on CPU; and the engine (``build_engine`` spawning rank 1 on ``cuda:1``) against
one GPU through the scenario of ``support.parallel_engine``.

Skipped where fewer than 2 CUDA/ROCm devices are present; ``tests/parallel`` runs the same code
paths (and the whole engine) over gloo on CPU.
"""

from __future__ import annotations

import pytest
import torch

from atom.models.deepseek_v4.checkpoint import random_state_dict
from atom.models.deepseek_v4.model import DeepseekV4Model
from atom.builtin_model import ensure_builtin_model
from atom.config import ParallelConfig
from support.parallel_engine import make_engine, scenario
from support.parallel_ranks import CFG, TOKENS, layers_rank, run_ranks, sharded_layers

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs a CUDA or ROCm GPU, 2 of them for NCCL "
                       f"(torch.cuda.device_count() is {torch.cuda.device_count()}); tests/parallel covers the same "
                       "sharding over gloo on CPU"),
]


@pytest.mark.parametrize("expert_parallel", [False, True], ids=["tp-experts", "expert-parallel"])
def test_two_gpus_over_nccl_match_the_unsharded_layers(expert_parallel):
    ref = DeepseekV4Model(CFG)
    ref.load_state_dict(random_state_dict(CFG, seed=1))
    with torch.no_grad():
        x, z, logits = sharded_layers(ref, TOKENS)
    got = [torch.from_numpy(a) for a in run_ranks(layers_rank, ("cuda", expert_parallel), results=1)[0]]
    assert torch.equal(got[0], x)  # the vocab-parallel lookup is exact
    torch.testing.assert_close(got[1], z, rtol=1e-5, atol=1e-5 * float(z.abs().max()))
    torch.testing.assert_close(got[2], logits, rtol=1e-5, atol=1e-5 * float(logits.abs().max()))


@pytest.mark.parametrize("parallel", [ParallelConfig(2), ParallelConfig(2, enable_expert_parallel=True)],
                         ids=["tp2", "tp2+ep2"])
def test_the_engine_over_two_gpus_gives_the_single_gpu_tokens_and_logits(tmp_path, parallel):
    model_dir = ensure_builtin_model(tmp_path)
    want_outputs, want_steps, _, _ = scenario(make_engine(model_dir, ParallelConfig(), device="cuda"))
    engine = make_engine(model_dir, parallel, device="cuda")
    try:
        outputs, steps, _, _ = scenario(engine)
    finally:
        engine.runner.close()
    assert outputs == want_outputs
    for (*_, got), (*_, want) in zip(steps, want_steps):
        torch.testing.assert_close(got.cpu(), want.cpu(), rtol=1e-4, atol=1e-4 * float(want.abs().max()))
