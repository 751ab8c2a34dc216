"""MoE dispatch/combine across two attention replicas over NCCL (``cuda:0`` and ``cuda:1``): each replica's
tokens through a hash-routed and a score-routed MoE layer, experts partitioned or split over both GPUs,
against the single-rank layer on CPU; a replica with no tokens, or running a padding step, takes part.
And the data-parallel runner (2 replicas of 1 GPU) against one GPU running each replica's requests.

Skipped where fewer than 2 CUDA/ROCm devices are present; ``tests/parallel/test_expert_exchange.py``
and ``tests/parallel/test_dp_runner.py`` run the same code over gloo on CPU.
"""

from __future__ import annotations

import pytest
import torch

from atom.builtin_model import ensure_builtin_model
from atom.config import ParallelConfig
from atom.engine_builder import build_engine
from atom.models.deepseek_v4_serving import DeepseekV4ForServing
from atom.parallel.dp_runner import start_data_parallel_runner
from support.dp_lockstep import PROMPTS, add_requests, engine_config, lockstep, rank_spec, scheduler_for
from support.exchange_ranks import CASES, CFG, exchange_reports, load_full, moe_outputs, replica_tokens

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs a CUDA or ROCm GPU, 2 of them for NCCL "
                       f"(torch.cuda.device_count() is {torch.cuda.device_count()}); tests/parallel covers the same "
                       "dispatch/combine over gloo on CPU"),
]

MODES = {"expert-parallel": True, "tp-experts": False}


@pytest.mark.parametrize("mode", list(MODES))
def test_two_gpus_exchange_rows_and_give_each_replica_the_single_rank_moe_output(mode):
    ref = DeepseekV4ForServing(CFG)
    load_full(ref, None)
    got = exchange_reports(MODES[mode], "cuda")
    for case in CASES:
        for g, w in zip(got[0, case], moe_outputs(ref, replica_tokens(0, case))):
            torch.testing.assert_close(torch.from_numpy(g), w, rtol=1e-5, atol=1e-5 * float(w.abs().max()))
    for g, w in zip(got[1, "both"], moe_outputs(ref, replica_tokens(1, "both"))):
        torch.testing.assert_close(torch.from_numpy(g), w, rtol=1e-5, atol=1e-5 * float(w.abs().max()))
    assert [a.shape for a in got[1, "empty"]] == [(0, CFG.dim)] * 2
    assert got[1, "padding"] is None


@pytest.mark.parametrize("mode", list(MODES))
def test_two_gpu_replicas_give_each_batch_its_single_gpu_logits(tmp_path, mode):
    model_dir = ensure_builtin_model(tmp_path)
    single = engine_config(model_dir, ParallelConfig(), "cuda")
    want = []
    for prompts in PROMPTS:
        runner = build_engine(single, keep_logits=True, poison=True).runner
        s = scheduler_for(single)
        add_requests(s, prompts, 4)
        want.append(lockstep(lambda batches: [runner.execute(batches[0])], [s])[0])
    par = ParallelConfig(1, data_parallel_size=2, enable_expert_parallel=MODES[mode])
    runner = start_data_parallel_runner(rank_spec(model_dir, par, "cuda"), keep_logits=True)
    try:
        schedulers = [scheduler_for(engine_config(model_dir, par, "cuda")) for _ in range(2)]
        for s, prompts in zip(schedulers, PROMPTS):
            add_requests(s, prompts, 4)
        logs = lockstep(runner.execute_all, schedulers)
    finally:
        runner.close()
    for got, w in zip(logs, want):
        assert [x[:2] for x in got] == [x[:2] for x in w]
        for (*_, g), (*_, x) in zip(got, w):
            torch.testing.assert_close(g.cpu(), x.cpu(), rtol=1e-4, atol=1e-4 * float(x.abs().max()))
