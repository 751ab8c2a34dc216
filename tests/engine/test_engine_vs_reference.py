"""The paged engine computes what the reference model computes: same greedy tokens, logits within
1e-4 relative at every step, under chunked prefill, preemption and both SWA retention modes."""

import pytest
import torch

from atom.models.deepseek_v4.checkpoint import load_checkpoint
from atom.sampling_params import SamplingParams
from support.interpreter_patching import cached_interpreter_patching  # noqa: F401  (a fixture)
from support.runtime_warnings import FAIL_ON_RUNTIME_WARNINGS
from support.shallow_model import make_shallow_engine, shallow_dir  # noqa: F401  (fixtures)

pytestmark = FAIL_ON_RUNTIME_WARNINGS

LENGTHS = (1, 5, 16, 33, 70, 129, 200, 300)
GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)


def prompts():
    return [[(37 * i + 11 * n) % 500 + 1 for i in range(n)] for n in LENGTHS]


def reference_logits(model, tokens):
    """Logits at every position of ``tokens`` from one reference prefill."""
    cache = model.new_cache(len(tokens) + 1)
    return model.prefill(cache, torch.tensor(tokens)).logits


def reference_greedy(model, prompt, n):
    cache = model.new_cache(len(prompt) + n + 1)
    out = model.prefill(cache, torch.tensor(prompt))
    tokens = []
    for i in range(n):
        tokens.append(int(out.logits[-1].argmax()))
        out = model.extend(cache, torch.tensor([tokens[-1]]), len(prompt) + i)
    return tokens


class ReferenceRuns:
    """:func:`reference_greedy` and :func:`reference_logits` of one reference model, each computed once: the
    parametrized cases below ask the same reference for the same prompts (and, when their tokens match, the
    same full sequences). The reference keeps no state between runs (a new cache each), so a second run
    would give the same tensors."""

    def __init__(self, model):
        self.model, self._greedy, self._logits = model, {}, {}

    def greedy(self, prompt: list[int], n: int) -> list[int]:
        key = (tuple(prompt), n)
        if key not in self._greedy:
            self._greedy[key] = reference_greedy(self.model, prompt, n)
        return self._greedy[key]

    def logits(self, tokens: list[int]) -> torch.Tensor:
        key = tuple(tokens)
        if key not in self._logits:
            self._logits[key] = reference_logits(self.model, tokens)
        return self._logits[key]


@pytest.fixture(scope="module")
def reference_runs(reference) -> ReferenceRuns:
    return ReferenceRuns(reference)


def run_recording_logits(engine):
    """Step to completion; check integrity each step; collect (seq_id, start, logits) per step."""
    steps = []
    while engine.has_unfinished_requests():
        step = engine.step_detailed()
        steps += [(item.seq_id, item.start_pos, step.output.logits[item.seq_id]) for item in step.batch.seqs]
        engine.check_integrity()
    return steps


@pytest.mark.parametrize("full_retain", [False, pytest.param(True, marks=pytest.mark.slow)])
@pytest.mark.parametrize("num_chunks", [200, pytest.param(5, marks=pytest.mark.slow)], ids=["roomy", "preempting"])
def test_greedy_tokens_and_every_steps_logits_match_the_reference(make_engine, reference_runs, full_retain,
                                                                  num_chunks):
    engine = make_engine(num_chunks=num_chunks, full_retain=full_retain)
    n_out = 6 if num_chunks == 200 else 40  # long decodes make running requests grow into each other
    params = SamplingParams(max_tokens=n_out, temperature=0.0, ignore_eos=True)
    seqs = []
    for p in prompts():
        seqs.append(engine.sequence(engine.add_request(p, params)))
    steps = run_recording_logits(engine)
    assert (engine.scheduler.num_preemptions > 0) == (num_chunks == 5)  # the tight arena must preempt
    for seq, p in zip(seqs, prompts()):
        assert seq.output_token_ids == reference_runs.greedy(p, n_out), f"prompt of {len(p)} tokens"
    full = {s.seq_id: reference_runs.logits(s.token_ids[:-1]) for s in seqs}
    for sid, start, logits in steps:
        want = full[sid][start:start + logits.shape[0]]
        torch.testing.assert_close(logits, want, rtol=1e-4, atol=1e-4 * float(want.abs().max()))


@pytest.mark.slow
@pytest.mark.usefixtures("cached_interpreter_patching")
def test_the_triton_kernels_give_the_same_greedy_tokens(make_shallow_engine, shallow_dir):
    engine = make_shallow_engine(backend="triton", budget=24)
    prompt = prompts()[4]
    seq = engine.sequence(engine.add_request(prompt, SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)))
    run_recording_logits(engine)
    assert seq.output_token_ids == reference_greedy(load_checkpoint(shallow_dir), prompt, 3)


def test_all_memory_returns_to_the_arena_when_requests_finish(make_engine):
    engine = make_engine(num_chunks=5)
    for p in prompts():
        engine.add_request(p, GREEDY)
    run_recording_logits(engine)
    bm = engine.scheduler.bm
    assert bm.comp.pool.num_used() == 0 and bm.swa.pool.num_used() == 0 and bm.slots.num_held() == 0
    bm.reset_prefix_cache()
    assert bm.arena.num_free_chunks() == bm.arena.layout.num_chunks


def test_a_youngest_request_preempting_itself_while_older_ones_run_does_not_stall_the_queue(reference):
    # the tight arena of the "preempting" case with a content-checking fake runner: a request that
    # preempts itself while older ones still run must not put the scheduler in its restart-alone mode
    from atom.config import CacheConfig, SchedulerConfig
    from atom.kv.block_manager import BlockManager
    from atom.kv.kv_layout import KvLayout
    from atom.model_engine.llm_engine import LLMEngine
    from atom.model_engine.scheduler import Scheduler
    from atom.model_engine.sequence import SequenceStatus
    from atom.testing.fake_runner import FakeRunner
    from atom.testing.kv_content_model import KvContentModel

    spec = reference.cfg.kv_spec("fp32", include_mtp=False)
    limits = SchedulerConfig(max_num_batched_tokens=37, max_num_seqs=8, max_model_len=512)
    layout = KvLayout.for_chunks(spec, 5, limits)
    sched = Scheduler(limits, BlockManager(layout, CacheConfig(kv_cache_bytes=layout.kv_cache_bytes)), None)
    content = KvContentModel(spec.block_size, spec.sliding_window, bool(spec.csa_layers),
                             lambda sid: sched.by_id[sid].token_ids)
    engine = LLMEngine(sched, FakeRunner(vocab_size=997, content=content))
    seqs = [engine.sequence(engine.add_request(p, SamplingParams(max_tokens=40, ignore_eos=True))) for p in prompts()]
    for _ in range(2000):
        if not engine.has_unfinished_requests():
            break
        engine.step()
        engine.check_integrity()
    assert all(s.status is SequenceStatus.FINISHED_LENGTH for s in seqs) and sched.num_preemptions > 0
