"""On a GPU: the overlapped engine loop, its steps on the runner's step thread, streams what the
sequential loop streams (tokens, text, finish reasons), with the default graph mode.

Skipped on machines without CUDA/ROCm; run in its own session (``pytest tests/gpu``).
"""

from __future__ import annotations

from support.gpu import gpu_module_marks

pytestmark = gpu_module_marks("tests/engine/test_overlap.py runs the same comparison on the CPU, also with "
                              "ModelRunner(step_thread=True)")


def _engine(overlap: bool):
    from atom.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
    from atom.engine_builder import build_engine

    limits = SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=8, max_model_len=256, overlap=overlap)
    return build_engine(EngineConfig(ModelConfig(device="cuda"), limits, CacheConfig(kv_cache_bytes=64 << 20)),
                        kernel_backend="triton")


def test_on_a_gpu_overlapped_steps_on_the_step_thread_stream_what_sequential_steps_stream():
    from atom.sampling_params import SamplingParams

    prompts = [[(17 * i + n) % 400 + 1 for i in range(20 + 11 * n)] for n in range(6)]
    params = [SamplingParams(max_tokens=24 + n, temperature=0.0 if n % 2 else 1.0, seed=n, ignore_eos=True)
              for n in range(6)]
    sequential = _engine(overlap=False)
    overlapped = _engine(overlap=True)
    assert overlapped.overlap and overlapped.runner._thread is not None  # the GPU default: a step thread
    want = sequential.generate(prompts, params, use_tqdm=False)
    got = overlapped.generate(prompts, params, use_tqdm=False)
    assert [(o.output_token_ids, o.text, o.finish_reason) for o in got] == \
        [(o.output_token_ids, o.text, o.finish_reason) for o in want]
