"""The merged FP8 W8A8 GEMMs on the engine: with every merged part but the last a whole number of 128-row scale
blocks (``q_lora_rank`` and ``moe_inter_dim`` 128; the built-in tiny model's 32 are refused), the Triton backend
with ``quant_sim`` on a release-format checkpoint runs ``wq_a`` + ``wkv``, ``wq_b`` + the indexer's ``wq_b`` and
the shared expert's ``w1`` + ``w3`` each as one ``w8a8_block_gemm``, and the engine's greedy tokens and logits are
those of the same engine with every merge undone (one GEMM per Linear) and of the ``quant_sim`` reference."""

from __future__ import annotations

import pytest
import torch

from atom.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from atom.engine_builder import build_engine
from atom.model_engine.llm_engine import LLMEngine
from atom.models.deepseek_v4.checkpoint import load_checkpoint, random_tensors, save_checkpoint
from atom.models.deepseek_v4.config import DeepseekV4Config
from atom.models.deepseek_v4.make_tiny_checkpoint import make_tiny_checkpoint
from atom.models.deepseek_v4.merged_linear import FP8_WEIGHT_BLOCK, MergedLinear
from atom.sampling_params import SamplingParams
from atom.tokenizer import write_builtin_tokenizer
from engine.test_engine_vs_reference import reference_greedy, run_recording_logits
from support.interpreter_patching import cached_interpreter_patching  # noqa: F401  (a fixture)
from support.runtime_warnings import FAIL_ON_RUNTIME_WARNINGS
from support.shallow_model import write_shallow_checkpoint

pytestmark = FAIL_ON_RUNTIME_WARNINGS

#: long enough for the CSA (ratio 4) and HCA (ratio 16) layers to compress during the prefill
PROMPT = [(11 * i + 7) % 500 + 1 for i in range(20)]
N_OUT = 3


@pytest.fixture(scope="module")
def aligned_dir(tmp_path_factory):
    """A release-format (FP8 linears, MXFP4 experts) tiny checkpoint whose merged FP8 parts are 128-row aligned."""
    cfg = DeepseekV4Config.tiny(q_lora_rank=FP8_WEIGHT_BLOCK, moe_inter_dim=FP8_WEIGHT_BLOCK)
    path = save_checkpoint(tmp_path_factory.mktemp("aligned"), cfg, random_tensors(cfg, 0), fp8=True,
                           fp4_experts=True)
    write_builtin_tokenizer(path)
    return path


@pytest.fixture(scope="module")
def shallow_aligned_dir(tmp_path_factory):
    """The same checkpoint cut to the tiny model's first three layers (``support.shallow_model``): one layer of
    each attention kind, so one of each merge group, on half the interpreted layers."""
    return write_shallow_checkpoint(tmp_path_factory.mktemp("shallow-aligned"), fp8=True, fp4_experts=True,
                                    q_lora_rank=FP8_WEIGHT_BLOCK, moe_inter_dim=FP8_WEIGHT_BLOCK)


def triton_engine(path) -> LLMEngine:
    cfg = EngineConfig(ModelConfig(path=str(path), device="cpu", dtype="float32", quant_sim="on"),
                       SchedulerConfig(max_num_batched_tokens=32, max_num_seqs=2, max_model_len=64),
                       CacheConfig(kv_cache_bytes=8 << 20))
    return build_engine(cfg, kernel_backend="triton", keep_logits=True)


def merge_groups(engine: LLMEngine) -> list[MergedLinear]:
    """Every layer's ``in_proj`` and shared-expert ``w1`` / ``w3``, and ``q_proj`` where an indexer joins it."""
    groups = []
    for block in engine.runner.model.layers:
        groups += [block.attn.in_proj, block.ffn._shared_w13]
        if block.attn.indexer is not None:
            groups.append(block.attn.q_proj)
    return groups


def greedy_run(engine: LLMEngine) -> tuple[list[int], dict[int, torch.Tensor]]:
    """The greedy tokens of :data:`PROMPT` and each step's logits keyed by the step's first position."""
    seq = engine.sequence(engine.add_request(PROMPT, SamplingParams(max_tokens=N_OUT, temperature=0.0,
                                                                    ignore_eos=True)))
    logits = {start: step_logits for _, start, step_logits in run_recording_logits(engine)}
    return seq.output_token_ids, logits


def test_the_triton_backend_merges_128_row_aligned_fp8_parts_into_one_w8a8_gemm(aligned_dir):
    groups = merge_groups(triton_engine(aligned_dir))
    assert len(groups) == 6 * 2 + 3  # three of the six layers have an indexer
    for group in groups:
        assert group.refusal is None and group.merged is not None, group.refusal
        assert group.merged.fmt == "fp8" and group.merged.w8a8[1].__name__ == "w8a8_block_gemm"
        assert group.merged.out_features == sum(p.out_features for p in group.parts)
        assert all(p.weight.untyped_storage().data_ptr() == group.merged.weight.untyped_storage().data_ptr()
                   for p in group.parts)


def test_the_built_in_tiny_sizes_keep_the_fp8_parts_as_separate_gemms(tmp_path):
    release = make_tiny_checkpoint(tmp_path, fp8=True, fp4_experts=True)
    block = triton_engine(release).runner.model.layers[1]
    for group in (block.attn.in_proj, block.ffn._shared_w13):
        assert group.merged is None
        assert group.refusal == f"an fp8 part other than the last has out_features not a multiple of {FP8_WEIGHT_BLOCK}"
    assert block.attn.q_proj.merged is not None  # wq_b's n_heads * head_dim = 128 rows are aligned


@pytest.mark.slow
@pytest.mark.usefixtures("cached_interpreter_patching")
def test_merged_w8a8_gemms_give_the_greedy_tokens_and_logits_of_one_gemm_per_linear(shallow_aligned_dir):
    merged_tokens, merged_logits = greedy_run(triton_engine(shallow_aligned_dir))
    separate = triton_engine(shallow_aligned_dir)
    for group in merge_groups(separate):
        group.bind(merge=False)
    separate_tokens, separate_logits = greedy_run(separate)
    assert merged_tokens == separate_tokens
    assert merged_tokens == reference_greedy(load_checkpoint(shallow_aligned_dir, quant_sim=True), PROMPT, N_OUT)
    assert merged_logits.keys() == separate_logits.keys() == {0, len(PROMPT), len(PROMPT) + 1}
    for start, logits in merged_logits.items():
        want = separate_logits[start]
        torch.testing.assert_close(logits, want, rtol=1e-4, atol=1e-4 * float(want.abs().max()))
