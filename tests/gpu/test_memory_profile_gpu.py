"""On a GPU: ``--gpu-memory-utilization`` sizes the arena so that serving the largest batch peaks within 5% of
the planned share (``F x total - graph pool``, as ``torch.cuda.max_memory_allocated`` reports it), and the
LM head's GEMM in bf16 with fp32 output stays within bf16 accumulation error of the fp32 reference."""

import re

import pytest
import torch

from support.gpu import gpu_module_marks

pytestmark = gpu_module_marks("tests/engine/test_memory_profile.py checks the split and the profiling run on "
                              "the CPU", compiled_triton=False)

GIB = 1 << 30


def test_serving_the_largest_batch_peaks_within_5_percent_of_the_planned_share(capfd):
    from atom.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
    from atom.engine_builder import build_engine
    from atom.sampling_params import SamplingParams

    limits = SchedulerConfig(max_num_batched_tokens=512, max_num_seqs=16, max_model_len=256)
    config = EngineConfig(ModelConfig(device="cuda", enforce_eager=True), limits,
                          CacheConfig(gpu_memory_utilization=0.05))
    engine = build_engine(config)
    line = next(l for l in capfd.readouterr().err.splitlines() if l.startswith("GPU memory:"))
    fraction, total, pool = (float(v) for v in re.search(
        r"GPU memory: ([\d.]+) x ([\d.]+) GiB .* graph pool ([\d.]+) GiB", line).groups())
    planned = (fraction * total - pool) * GIB
    torch.cuda.reset_peak_memory_stats()
    prompts = [[1 + (i * 5 + j) % 400 for j in range(32)] for i in range(16)]
    engine.generate(prompts, SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True), use_tqdm=False)
    peak = torch.cuda.max_memory_allocated()
    assert abs(peak - planned) <= 0.05 * planned, (peak, planned, line)


def test_the_bf16_lm_head_with_fp32_output_is_within_bf16_accumulation_error_of_the_fp32_head():
    from support.decode_runs import thin_model

    model = thin_model("cuda").to(torch.bfloat16)
    x = torch.randn(8, model.cfg.dim, device="cuda").to(torch.bfloat16)
    out = model.logits(x)
    ref = torch.nn.functional.linear(x.float(), model.head.weight.float())
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def test_a_speculative_engine_replays_verify_graphs_within_5_percent_of_the_planned_share(capfd):
    """With speculative decoding the served engine replays its verify steps from CUDA graphs, and the profile
    sizes the graph pool from the largest verify step on the graphs' inputs (every request padded to K
    drafts): serving the largest batch with drafts peaks within 5% of ``F x total`` (the graph pool lives
    in the same allocator)."""
    from atom.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
    from atom.engine_builder import build_engine
    from atom.sampling_params import SamplingParams

    limits = SchedulerConfig(max_num_batched_tokens=512, max_num_seqs=16, max_model_len=256, speculative_num_tokens=2)
    config = EngineConfig(ModelConfig(device="cuda"), limits, CacheConfig(gpu_memory_utilization=0.05))
    engine = build_engine(config)
    assert engine.runner.decode is not None and engine.runner.decode.capture
    line = next(l for l in capfd.readouterr().err.splitlines() if l.startswith("GPU memory:"))
    fraction, total = (float(v) for v in re.search(r"GPU memory: ([\d.]+) x ([\d.]+) GiB", line).groups())
    planned = fraction * total * GIB
    torch.cuda.reset_peak_memory_stats()
    prompts = [[1 + (i * 5 + j) % 400 for j in range(32)] for i in range(16)]
    engine.generate(prompts, SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True), use_tqdm=False)
    peak = torch.cuda.max_memory_allocated()
    assert len(engine.runner.decode.graphs) >= 1
    assert abs(peak - planned) <= 0.05 * planned, (peak, planned, line)
