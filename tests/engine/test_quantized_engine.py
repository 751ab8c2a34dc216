"""The engine serving a release-format checkpoint (FP8 linears, MXFP4 experts) keeps the weights quantized and
produces the greedy tokens of the reference model run on the dequantized weights."""

import pytest
import torch

from atom.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from atom.engine_builder import build_engine
from atom.models.deepseek_v4.checkpoint import load_checkpoint
from atom.models.deepseek_v4.make_tiny_checkpoint import make_tiny_checkpoint
from atom.sampling_params import SamplingParams
from engine.test_engine_vs_reference import reference_greedy
from support.interpreter_patching import cached_interpreter_patching  # noqa: F401  (a fixture)
from support.runtime_warnings import FAIL_ON_RUNTIME_WARNINGS
from support.shallow_model import shallow_release_dir  # noqa: F401  (a fixture)

pytestmark = FAIL_ON_RUNTIME_WARNINGS

PROMPTS = ([(7 * i + 3) % 500 + 1 for i in range(33)], [(13 * i + 5) % 500 + 1 for i in range(9)])


@pytest.fixture(scope="module")
def release_dir(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("release"), fp8=True, fp4_experts=True, shards=2)


def generate(release_dir, backend=None, n=5, **config):
    cfg = EngineConfig(ModelConfig(path=str(release_dir), device="cpu", dtype="float32", **config),
                       SchedulerConfig(max_num_batched_tokens=32, max_num_seqs=4, max_model_len=128),
                       CacheConfig(kv_cache_bytes=8 << 20))
    engine = build_engine(cfg, kernel_backend=backend)
    seqs = []
    for p in PROMPTS:
        seqs.append(engine.sequence(engine.add_request(p, SamplingParams(max_tokens=n, temperature=0.0,
                                                                         ignore_eos=True))))
    while engine.has_unfinished_requests():
        engine.step()
    return engine, [s.output_token_ids for s in seqs]


def test_the_engine_keeps_quantized_weights_and_matches_the_dequantized_reference(release_dir):
    engine, outputs = generate(release_dir, quant_sim="off")
    state = engine.runner.model.state_dict()
    assert state["layers.2.ffn.experts.0.w3.weight"].dtype == torch.uint8
    assert state["layers.2.attn.wq_a.weight"].dtype == torch.float8_e4m3fn
    assert not any(n.startswith("mtp.") for n in state)
    reference = load_checkpoint(release_dir, keep_quantized=False)
    assert outputs == [reference_greedy(reference, p, 5) for p in PROMPTS]


def test_quant_sim_defaults_on_for_a_checkpoint_that_declares_quantization(release_dir):
    engine, outputs = generate(release_dir, n=3)
    assert engine.runner.model.cfg.quant_sim
    assert engine.runner.model.layers[0].attn.wq_a.act_block == 64
    reference = load_checkpoint(release_dir, quant_sim=True)
    assert outputs == [reference_greedy(reference, p, 3) for p in PROMPTS]


@pytest.mark.slow
@pytest.mark.usefixtures("cached_interpreter_patching")
def test_the_triton_gemms_give_the_same_greedy_tokens(shallow_release_dir):
    engine, outputs = generate(shallow_release_dir, backend="triton", n=2, quant_sim="off")
    assert engine.runner.model.layers[1].ffn.experts[0].w1.gemm.__name__ == "mxfp4_gemm"
    reference = load_checkpoint(shallow_release_dir, keep_quantized=False)
    assert outputs == [reference_greedy(reference, p, 2) for p in PROMPTS]
