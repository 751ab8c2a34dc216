"""The engine on the Triton backend with the release numerics (``quant_sim``) on a release-format checkpoint: its
FP8 linears multiply FP8 activations (W8A8), the norms in front of them quantize in their own launch, and the
greedy tokens are the reference model's with the same numerics."""

import pytest

from atom.models.deepseek_v4.checkpoint import load_checkpoint
from atom.models.deepseek_v4.make_tiny_checkpoint import make_tiny_checkpoint
from engine.test_engine_vs_reference import reference_greedy
from engine.test_quantized_engine import PROMPTS, generate
from support.interpreter_patching import cached_interpreter_patching  # noqa: F401  (a fixture)
from support.runtime_warnings import FAIL_ON_RUNTIME_WARNINGS
from support.shallow_model import shallow_release_dir  # noqa: F401  (a fixture)

pytestmark = FAIL_ON_RUNTIME_WARNINGS


@pytest.fixture(scope="module")
def release_dir(tmp_path_factory):
    return make_tiny_checkpoint(tmp_path_factory.mktemp("release"), fp8=True, fp4_experts=True, shards=2)


@pytest.mark.slow
@pytest.mark.usefixtures("cached_interpreter_patching")
def test_the_triton_backend_with_quant_sim_runs_w8a8_and_gives_the_reference_greedy_tokens(shallow_release_dir):
    engine, outputs = generate(shallow_release_dir, backend="triton", n=2, quant_sim="on")
    model = engine.runner.model
    block = model.layers[1]
    for lin in (block.attn.wq_a, block.attn.wkv, block.attn.wq_b, block.attn.indexer.wq_b, block.attn.wo_b,
                block.ffn.shared_experts.w1, block.ffn.shared_experts.w2):
        assert lin.w8a8 is not None and lin.w8a8[1].__name__ == "w8a8_block_gemm", lin
    assert (block.attn_norm.fp8_block, block.attn.q_norm.fp8_block, block.ffn_norm.fp8_block) == (64, 32, 64)
    reference = load_checkpoint(shallow_release_dir, quant_sim=True)
    assert outputs == [reference_greedy(reference, p, 2) for p in PROMPTS]


def test_the_torch_backend_with_quant_sim_keeps_the_weight_only_gemm(release_dir):
    engine, _ = generate(release_dir, n=1, quant_sim="on")
    block = engine.runner.model.layers[1]
    assert block.attn.wq_a.w8a8 is None and block.attn.wq_a.act_block == 64
    assert block.attn_norm.fp8_block == 0
