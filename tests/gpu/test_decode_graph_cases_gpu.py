"""On a GPU: the decode-graph cases beyond the plain dense step, replayed from real CUDA graphs against the same
steps run eagerly on the same bucketed inputs: release-format MoE (FP8 linears, MXFP4 routed experts on the
fused op, quant_sim on), the MTP verify step, and tensor- and expert-parallel ranks over NCCL (2 GPUs).

The fused MoE's down projection adds a token's expert rows with atomics, in no fixed order on a GPU, so a
replay is compared with eager decode by its tokens and by logits within 1e-5 of the step's largest.
"""

from __future__ import annotations

import pytest
import torch

from atom.builtin_model import ensure_builtin_model
from atom.config import CacheConfig, EngineConfig, ModelConfig, ParallelConfig, SchedulerConfig
from atom.engine_builder import build_engine
from atom.sampling_params import SamplingParams
from atom.testing.graph_cases import mtp_model, release_model, short_run
from support.gpu import gpu_module_marks

pytestmark = gpu_module_marks("tests/engine/test_decode_graph_cases.py and "
                              "tests/parallel/test_parallel_decode_graphs.py replay the same cases through the "
                              "CPU emulation of capture")


def assert_same_run(graph, eager):
    assert graph.tokens == eager.tokens
    assert len(graph.logits) == len(eager.logits)
    for a, b in zip(graph.logits, eager.logits):
        assert float((a - b).abs().max()) <= 1e-5 * float(b.abs().max())


@torch.no_grad()
def test_release_format_decode_steps_replayed_from_cuda_graphs_equal_the_same_steps_run_eagerly(tmp_path):
    model = release_model(tmp_path, device="cuda")
    graph = short_run(model, "graph", kernel_backend="triton")
    assert {4, 2, 1} <= set(graph.buckets)
    assert_same_run(graph, short_run(model, "padded", kernel_backend="triton"))


@torch.no_grad()
def test_mtp_verify_steps_replayed_from_cuda_graphs_equal_the_same_steps_run_eagerly():
    model = mtp_model().to("cuda")
    graph = short_run(model, "graph", speculative=1, kernel_backend="triton")
    assert len(graph.buckets) > 0
    assert_same_run(graph, short_run(model, "padded", speculative=1, kernel_backend="triton"))


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="tensor parallelism over NCCL needs 2 GPUs "
                    f"(torch.cuda.device_count() is {torch.cuda.device_count()})")
@pytest.mark.parametrize("parallel", [ParallelConfig(2), ParallelConfig(2, enable_expert_parallel=True)],
                         ids=["tp2", "tp2+ep2"])
def test_ranks_replaying_their_own_cuda_graphs_give_the_tokens_of_eager_ranks(tmp_path, parallel):
    model_dir = ensure_builtin_model(tmp_path)

    def tokens(enforce_eager: bool) -> list[list[int]]:
        config = EngineConfig(ModelConfig(path=str(model_dir), device="cuda", dtype="float32",
                                          enforce_eager=enforce_eager),
                              SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=4, max_model_len=128),
                              CacheConfig(kv_cache_bytes=16 << 20, enable_prefix_caching=False), parallel)
        engine = build_engine(config)
        try:
            seqs = [engine.sequence(engine.add_request([(7 * i + n) % 500 + 1 for i in range(n)],
                                                       SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True)))
                    for n, m in ((9, 12), (14, 8), (20, 5), (5, 3))]
            while engine.has_unfinished_requests():
                engine.step()
            decode = engine.runner.local.decode  # rank 0's runner; every rank decides the same
            assert (decode is not None and len(decode.graphs) > 0) == (not enforce_eager)
            return [s.output_token_ids for s in seqs]
        finally:
            engine.runner.close()

    assert tokens(enforce_eager=False) == tokens(enforce_eager=True)
