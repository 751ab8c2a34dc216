"""Decode steps of the release format (FP8 linears, MXFP4 routed experts, quant_sim on) and MTP verify steps,
captured in CUDA graphs and replayed through the CPU emulation (atom.testing.graph_cases): the replay equals
eager decode on the same bucketed shapes bit for bit, and samples what unpadded eager decode samples while the
batch changes bucket."""

import pytest

from atom.config import SchedulerConfig
from atom.kv.kv_layout import KvLayout
from atom.model_executor.model_runner import ModelRunner
from atom.testing.graph_checks import UNPADDED_BOUND
from atom.testing.graph_cases import SHORT_LEN, mtp_model, release_model, run_case, short_run

pytestmark = pytest.mark.slow  # each case runs the short scenario three times (about a minute on 2 cores)


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    return release_model(tmp_path_factory.mktemp("release"))


def test_a_release_format_decode_step_is_refused_by_graph_mode_when_its_experts_run_one_gemm_each(release):
    layout = KvLayout.for_chunks(release.cfg.kv_spec("fp32", include_mtp=False), 8,
                                 SchedulerConfig(max_num_seqs=4, max_model_len=SHORT_LEN))
    with pytest.raises(ValueError, match="routed experts of layers"):
        ModelRunner(release, layout, max_model_len=SHORT_LEN, kernel_backend="torch", graph_mode="graph",
                    host_free_experts=False)


@pytest.fixture(scope="module")
def release_runs(release):
    return run_case(release)


def test_release_format_decode_steps_replayed_from_graphs_equal_eager_decode(release_runs):
    runs, result = release_runs
    graph = runs["graph"]
    assert {4, 2, 1} <= set(graph.buckets) and len(graph.buckets) >= 10  # the batch changed bucket
    assert [len(t) for t in graph.tokens] == [12, 8, 5, 3]
    assert result.same_shapes  # tokens and every step's logits, bit for bit
    assert result.tokens_equal
    assert result.unpadded <= UNPADDED_BOUND  # rows and index widths of other shapes only (measured 3.8e-7)


def test_release_format_graphs_sample_the_tokens_of_the_reference_models_per_expert_gemms(release, release_runs):
    """The grouped experts of the graph path round differently from the per-expert GEMMs eager decode runs
    by default; on this scenario the greedy tokens are the same."""
    assert release_runs[0]["graph"].tokens == short_run(release, "eager", host_free_experts=False).tokens


@pytest.fixture(scope="module")
def verify_runs():
    return run_case(mtp_model(), speculative=2)


def test_mtp_verify_steps_replayed_from_graphs_equal_eager_speculative_decoding(verify_runs):
    """Every decoding request verifies up to two MTP drafts in the bucketed step; sampling, the commit of the
    accepted drafts and the next drafts run after it on its inputs and final stream."""
    runs, result = verify_runs
    graph = runs["graph"]
    assert len(set(graph.buckets)) >= 2 and len(graph.buckets) >= 5  # verify steps, in more than one bucket
    assert [len(t) for t in graph.tokens] == [12, 8, 5, 3]
    assert result.same_shapes
    assert result.tokens_equal
    assert result.unpadded <= UNPADDED_BOUND
    assert graph.accepted == runs["padded"].accepted == runs["eager"].accepted


def test_every_verify_step_replays_a_graph_with_the_drafts_a_request_lacks_padded(verify_runs):
    """Near ``max_tokens`` a request gets fewer than two drafts (one, then none): its missing draft slots are
    padding, rejected by construction (never sampled), so those steps replay the verify graph too and the
    tokens stay those of eager decoding."""
    runs, result = verify_runs
    graph = runs["graph"]
    assert len(graph.buckets) == len(graph.logits) - 1  # every sampling step but the one prefill step
    assert graph.padded_drafts >= 4 and runs["padded"].padded_drafts == graph.padded_drafts
    assert result.same_shapes and result.tokens_equal


def test_mtp_verify_graphs_sample_the_tokens_of_decoding_without_drafts(verify_runs):
    plain = mtp_model()
    del plain.mtp[0]  # the same main layers, served without the MTP layer (an arena without its rows)
    assert verify_runs[0]["graph"].tokens == short_run(plain, "eager").tokens
