"""The served engine with speculative decoding replays its verify steps from CUDA graphs: ``build_engine``
picks ``graph`` mode for it as for plain decoding (on a device that can capture), and every verify step,
those where a request has fewer drafts than the engine verifies included, replays the graph of its
bucket. Run through the CPU emulation of capture and replay (:mod:`atom.testing.graph_emulation`), on the
code path the server builds."""

import pytest
import torch

from atom.config import CacheConfig, EngineConfig, ModelConfig, SchedulerConfig
from atom.engine_builder import build_engine
from atom.models.deepseek_v4_serving import DeepseekV4ForServing
from atom.sampling_params import SamplingParams
from atom.testing.graph_emulation import EmulatedGraph, cuda_graph_emulation

pytestmark = pytest.mark.slow  # three engines over the same requests (about a minute on 2 cores)

PROMPT_LENS = (9, 14, 20, 5)
OUTPUTS = (12, 8, 5, 3)  # the decode batch shrinks 4 -> 3 -> 2 -> 1


def served_config(tiny_dir, *, speculative: int, enforce_eager: bool) -> EngineConfig:
    limits = SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=4, max_model_len=128,
                             speculative_num_tokens=speculative)
    return EngineConfig(ModelConfig(path=str(tiny_dir), device="cpu", enforce_eager=enforce_eager), limits,
                        CacheConfig(kv_cache_bytes=1 << 24, enable_prefix_caching=False))


def run_requests(engine) -> list[list[int]]:
    gen = torch.Generator().manual_seed(11)
    prompts = [torch.randint(1, 500, (n,), generator=gen).tolist() for n in PROMPT_LENS]
    ids = [engine.add_request(p, SamplingParams(max_tokens=m, temperature=0.0, ignore_eos=True))
           for p, m in zip(prompts, OUTPUTS)]
    final = {}
    while engine.has_unfinished_requests():
        final.update((out.request_id, out) for out in engine.step() if out.finished)
    return [final[rid].output_token_ids for rid in ids]


@pytest.fixture(scope="module")
def served(tiny_dir):
    """The speculative engine as served on a device that captures graphs (emulated), its replays and steps."""
    patch = pytest.MonkeyPatch()
    # a CPU model declares no graphs; on the emulated device it may, as a GPU model with host-free experts does
    patch.setattr(DeepseekV4ForServing, "supports_decode_graphs",
                  property(lambda self: not self.host_synced_layers))
    replays, steps = [], []
    replay = EmulatedGraph.replay
    patch.setattr(EmulatedGraph, "replay", lambda self: replays.append(self) or replay(self))
    try:
        with cuda_graph_emulation(), torch.no_grad():
            engine = build_engine(served_config(tiny_dir, speculative=2, enforce_eager=False), kernel_backend="torch",
                                  poison=True)
            runner = engine.runner
            execute = runner.execute
            runner.execute = lambda batch: steps.append(batch) or execute(batch)
            tokens = run_requests(engine)
    finally:
        patch.undo()
    return engine, tokens, replays, steps


def test_the_served_speculative_engine_captures_verify_graphs_and_replays_every_verify_step(served):
    engine, tokens, replays, steps = served
    runner = engine.runner
    assert runner.decode is not None and runner.decode.capture and runner.decode.buffers.drafts == 2
    assert len(runner.decode.graphs) >= 3  # buckets 4, 2 and 1 (and their context buckets)
    verify = [b for b in steps if runner.decode.buffers.bucket_for(b) is not None]
    others = [b for b in steps if b.seqs and runner.decode.buffers.bucket_for(b) is None]
    assert all(any(s.state_reset or s.num_tokens != 1 + s.num_draft for s in b.seqs) for b in others)  # prefills
    assert len(verify) == len(replays) >= 10
    assert sum(runner.decode.buffers.padded_drafts(b) for b in verify) >= 4  # a request with fewer drafts
    assert [len(t) for t in tokens] == list(OUTPUTS)


def test_the_served_verify_graphs_sample_the_tokens_of_eager_speculative_and_plain_decoding(served, tiny_dir):
    with torch.no_grad():
        eager = run_requests(build_engine(served_config(tiny_dir, speculative=2, enforce_eager=True),
                                          kernel_backend="torch", poison=True))
        plain = run_requests(build_engine(served_config(tiny_dir, speculative=0, enforce_eager=True),
                                          kernel_backend="torch", poison=True))
    assert served[1] == eager == plain
