"""The speculative decoding benchmark on a GPU: the oracle draft is always accepted and MTP drafts keep
the tokens of the run without speculation (skipped without a CUDA or ROCm GPU)."""

from atom.bench.speculative import bench_prompts, run_speculative
from atom.testing.replay_draft import ReplayDraft
from support.gpu import gpu_module_marks

pytestmark = gpu_module_marks(
    "tests/engine/test_speculative.py covers the same machinery on the CPU", compiled_triton=False)


def test_speculative_decoding_on_the_gpu_prints_its_figures_and_keeps_the_greedy_tokens(capsys):
    prompts = bench_prompts(3)
    off = run_speculative(prompts, 24, 0, None, device="cuda")
    oracle = run_speculative(prompts, 24, 3, ReplayDraft({tuple(p): o for p, o in zip(prompts, off.outputs)}),
                             device="cuda", source="oracle")
    mtp = run_speculative(prompts, 24, 2, None, device="cuda")
    for r in (off, oracle, mtp):
        print(r.line(off))
    assert oracle.outputs == off.outputs and mtp.outputs == off.outputs
    assert oracle.accepted == oracle.proposed > 0 and oracle.tokens_per_forward > 2.0
