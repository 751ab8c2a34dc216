"""Decode steps on the bucketed, preallocated inputs a CUDA graph replays ("padded" mode) sample what
steps on fresh inputs sample, padding requests write nothing, and only plain decode steps are padded."""

import pytest
import torch
from support.decode_runs import MAX_LEN, sampled_run, thin_model

from atom.config import CacheConfig, ModelConfig, SchedulerConfig
from atom.model_executor.decode_graphs import serving_graph_mode
from atom.kv.kv_layout import plan_kv_layout
from atom.model_executor.model_runner import ModelRunner
from atom.model_ops.decode_buffers import DecodeBuffers, decode_buckets


@pytest.fixture(scope="module")
def thin():
    return thin_model()


@pytest.fixture(scope="module")
def layout(thin):
    limits = SchedulerConfig(max_num_batched_tokens=48, max_num_seqs=4, max_model_len=MAX_LEN)
    return plan_kv_layout(thin.cfg.kv_spec("fp32", include_mtp=False), CacheConfig(kv_cache_bytes=1 << 26), limits)


def test_decode_batches_are_padded_to_powers_of_two_then_the_largest_batch():
    assert decode_buckets(1) == (1,)
    assert decode_buckets(5) == (1, 2, 4, 5)
    assert decode_buckets(8) == (1, 2, 4, 8)
    with pytest.raises(ValueError, match="max_seqs"):
        decode_buckets(0)


@pytest.mark.slow
@torch.no_grad()
def test_padded_decode_steps_sample_the_tokens_of_eager_steps_with_logits_equal_up_to_rounding(thin, monkeypatch):
    eager_tokens, eager_logits = sampled_run(thin, "eager")
    fill, padded = DecodeBuffers.fill, []
    monkeypatch.setattr(DecodeBuffers, "fill", lambda self, batch, tables: padded.append(len(batch.seqs)) or
                        fill(self, batch, tables))
    padded_tokens, padded_logits = sampled_run(thin, "padded")
    assert padded[:3] == [5, 5, 5] and padded[-1] == 1 and len(padded) >= 12  # decode steps of 5 .. 1 requests
    assert padded_tokens == eager_tokens
    assert [t.shape for t in padded_logits] == [t.shape for t in eager_logits]
    for a, b in zip(padded_logits, eager_logits):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-5)
    assert sum(len(t) for t in eager_tokens.values()) == sum(6 + 3 * i for i in range(5))


@torch.no_grad()
def test_a_step_of_padding_requests_writes_nothing_into_the_arena(thin, layout):
    runner = ModelRunner(thin, layout, max_model_len=MAX_LEN, kernel_backend="torch", graph_mode="padded", poison=True)
    before = runner.views.buffer.clone()
    runner.decode.buffers.pad(4)
    logits, _ = runner._forward(runner.decode.buffers.inputs(4))
    assert logits.shape == (4, thin.cfg.vocab_size)
    assert torch.equal(runner.views.buffer, before)


def test_graph_modes_are_checked(thin, layout):
    with pytest.raises(ValueError, match="accepted: eager, padded, graph"):
        ModelRunner(thin, layout, max_model_len=MAX_LEN, graph_mode="replay")
    with pytest.raises(ValueError, match="keep_logits"):
        ModelRunner(thin, layout, max_model_len=MAX_LEN, graph_mode="padded", keep_logits=True)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU refusal; a GPU machine captures graphs")
def test_graph_capture_is_refused_without_a_gpu_and_a_cpu_engine_serves_eagerly(thin, layout):
    assert serving_graph_mode(thin, enforce_eager=False) == "eager"
    with pytest.raises(ValueError, match="enforce_eager"):
        ModelConfig(enforce_eager="yes")
    with pytest.raises(ValueError, match="needs a CUDA or ROCm GPU"):
        ModelRunner(thin, layout, max_model_len=MAX_LEN, graph_mode="graph")
