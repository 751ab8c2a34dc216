"""One decode step of the paged engine reads nothing back from the device and dispatches the same ops
whatever the batch size (what CUDA-graph capture needs), and a prefill step the same ops whatever the
chunk length, counted with a TorchDispatchMode."""

import pytest
import torch

from atom.bench.forward import counted_forward, make_engine, prompt
from atom.bench.op_count import SYNC_OPS, OpCounter
from atom.models.deepseek_v4.checkpoint import random_state_dict
from atom.models.deepseek_v4.config import DeepseekV4Config
from atom.models.deepseek_v4_serving import DeepseekV4ForServing
from atom.sampling_params import SamplingParams


@pytest.fixture(scope="module")
def thin():
    """Flash-like structure (SWA, CSA and HCA layers, hash-routed layers, top-k routing) at toy widths."""
    cfg = DeepseekV4Config.tiny(n_mtp_layers=0, compress_ratios=(0, 4, 16, 4, 16, 4), vocab_size=1024)
    model = DeepseekV4ForServing(cfg)
    model.load_state_dict(random_state_dict(cfg, seed=3))
    return model.eval()


def decode_step_ops(model, batch_size):
    """(ops of the forward inside one decode step of ``batch_size`` requests, the RunnerOutput)."""
    engine = make_engine(model, batch_size, 64, 40 * batch_size)
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    for i in range(batch_size):
        engine.add_request(prompt(31 + i % 3, i), params)  # some requests complete CSA/HCA entries this step
    engine.step()  # the prefill of every request
    runner, batch = engine.runner, engine.scheduler.schedule()  # the decode step, run below by the runner alone
    assert len(batch.seqs) == batch_size and all(s.num_tokens == 1 for s in batch.seqs)
    return counted_forward(runner, batch, OpCounter)


@pytest.mark.slow
@torch.no_grad()
def test_a_decode_step_never_syncs_and_its_op_count_does_not_depend_on_the_batch_size(thin):
    one, out1 = decode_step_ops(thin, 1)
    many, out32 = decode_step_ops(thin, 32)
    for c in (one, many):
        assert {name: c.ops[name] for name in SYNC_OPS} == {name: 0 for name in SYNC_OPS}
    assert one.total == many.total and one.total > 0
    assert one.ops == many.ops
    assert len(out1.sampled) == 1 and len(out32.sampled) == 32


def prefill_ops(model, num_tokens):
    """Ops of the forward of one request's first prefill chunk of ``num_tokens`` tokens."""
    engine = make_engine(model, 1, 128, num_tokens)
    engine.add_request(prompt(num_tokens, 0), SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))
    return counted_forward(engine.runner, engine.scheduler.schedule(), OpCounter)[0]


@pytest.mark.slow
@torch.no_grad()
def test_a_prefill_step_never_syncs_and_its_op_count_does_not_depend_on_the_chunk_length(thin):
    prefill_ops(thin, 8)  # the first forward stacks the experts' weights once
    short, long = prefill_ops(thin, 40), prefill_ops(thin, 100)
    assert short.syncs == 0 and long.syncs == 0
    assert short.ops == long.ops and short.total > 0
