"""Data-parallel attention (2 replicas of 1 gloo rank, with and without expert parallelism, and 2 replicas of 2
ranks) computes what one rank computes: the engine scenario of
``support.parallel_engine`` (a 32-token prefix, the 40-token prompt that hits it with a CSA restore on a
NaN-poisoned arena, then four requests whose long decodes outgrow a 5-chunk arena and force a preemption)
through ``build_engine`` with ``data_parallel_size=2`` (the path ``atom serve -dp 2`` takes).

Each replica has its own scheduler and arena, so the steps are compared per replica: replica ``d``'s steps
(which requests, from which position, restoring which page, and every row's logits) equal those of a
single-rank engine given exactly the requests sent to ``d`` (by the router, or placed: see PHASES), at the
same points; the greedy tokens also equal the single-rank run of the whole scenario on one arena. Logits
within 1e-5 relative."""

from __future__ import annotations

import pytest
import torch

from atom.config import CacheConfig, EngineConfig, ModelConfig, ParallelConfig, SchedulerConfig
from atom.engine_builder import build_engine
from atom.kv.kv_layout import KvLayout
from atom.model_engine.dp_engine import DataParallelEngine
from atom.model_engine.sequence import Sequence
from atom.models.deepseek_v4.loader import read_config
from atom.sampling_params import SamplingParams
from support.parallel_engine import CONCURRENT, PROMPT, make_engine, scenario

pytestmark = pytest.mark.slow

#: (prompts, max_tokens, replica) submitted together, each phase run until idle: the scenario of
#: support.parallel_engine. The prefix and the prompt that extends it are routed (the router sends the second
#: where the first is cached); the four long decodes are all placed on replica 1, where they outgrow its
#: 5-chunk arena and force a preemption while replica 0 has nothing to run (padding steps).
PHASES = [([PROMPT[:32]], 1, None), ([PROMPT], 2, None), (CONCURRENT, 40, 1)]
LIMITS = SchedulerConfig(max_num_batched_tokens=24, max_num_seqs=4, max_model_len=512, overlap=False)

MODES = {
    "dp2": ParallelConfig(data_parallel_size=2),
    "dp2+ep2": ParallelConfig(data_parallel_size=2, enable_expert_parallel=True),
    "dp2xtp2+ep4": ParallelConfig(tensor_parallel_size=2, data_parallel_size=2, enable_expert_parallel=True),
}


def engine_for(model_dir, parallel: ParallelConfig):
    """The scenario's engine (5-chunk arena per replica, fp32, NaN-poisoned arena, logits kept), sequential steps."""
    kv = KvLayout.for_chunks(read_config(model_dir).kv_spec("fp32", include_mtp=False), 5, LIMITS).kv_cache_bytes
    config = EngineConfig(ModelConfig(path=str(model_dir), device="cpu", dtype="float32"), LIMITS,
                          CacheConfig(kv_cache_bytes=kv), parallel)
    return build_engine(config, keep_logits=True, poison=True)


def greedy(max_tokens: int) -> SamplingParams:
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)


def renumbered(steps: list) -> list:
    """Steps with each request's id replaced by its order of first appearance (ids are process-global)."""
    order = {sid: i for i, sid in enumerate(dict.fromkeys(s[0] for s in steps))}
    return [(order[sid], *rest) for sid, *rest in steps]


def run_data_parallel(engine: DataParallelEngine):
    """(outputs per phase, replica of each request per phase, steps per replica, padding steps per replica)."""
    outputs, placed, steps, padding = [], [], [[] for _ in range(engine.replicas)], [0] * engine.replicas
    for prompts, max_tokens, replica in PHASES:
        if replica is None:
            rids = [engine.add_request(p, greedy(max_tokens)) for p in prompts]
        else:
            block = engine.schedulers[replica].block_size
            rids = [engine.add_sequence(Sequence(p, greedy(max_tokens), block), replica=replica) for p in prompts]
        seqs = [engine.sequence(r) for r in rids]
        placed.append([engine.replica_of(r) for r in rids])
        while engine.has_unfinished_requests():
            step = engine.step_detailed()
            for d, (batch, out) in enumerate(zip(step.batches, step.runner_outputs)):
                padding[d] += step.ran and batch is None
                if batch is not None:
                    steps[d] += [(s.seq_id, s.start_pos, s.restore_page, out.logits[s.seq_id]) for s in batch.seqs]
            engine.check_integrity()
        outputs.append([(s.output_token_ids, s.num_cached_tokens) for s in seqs])
    return outputs, placed, [renumbered(s) for s in steps], padding


def run_one_replica(model_dir, phases: list) -> tuple[list, list]:
    """A single-rank engine given ``phases`` (a phase with no prompt is skipped): (outputs per phase, steps)."""
    engine = engine_for(model_dir, ParallelConfig())
    outputs, steps = [], []
    for prompts, max_tokens in phases:
        rids = [engine.add_request(p, greedy(max_tokens)) for p in prompts]
        seqs = [engine.sequence(r) for r in rids]
        while engine.has_unfinished_requests():
            step = engine.step_detailed()
            steps += [(s.seq_id, s.start_pos, s.restore_page, step.output.logits[s.seq_id]) for s in step.batch.seqs]
        outputs.append([(s.output_token_ids, s.num_cached_tokens) for s in seqs])
    return outputs, renumbered(steps)


@pytest.fixture(scope="module")
def one_replica_runs(tiny_dir):
    """:func:`run_one_replica` of given phases, each computed once per module: every mode routes the same requests
    to the same replicas (each test asserts the placement), so the modes compare with the same single-rank runs."""
    runs: dict[tuple, tuple[list, list]] = {}

    def run(phases: list) -> tuple[list, list]:
        key = tuple((tuple(tuple(p) for p in prompts), n) for prompts, n in phases)
        if key not in runs:
            runs[key] = run_one_replica(tiny_dir, phases)
        return runs[key]
    return run


@pytest.fixture(scope="module")
def whole_scenario_tokens(tiny_dir):
    torch.set_num_threads(1)
    outputs, *_ = scenario(make_engine(tiny_dir, ParallelConfig()))
    return outputs


@pytest.mark.parametrize("mode", list(MODES))
def test_each_replica_computes_what_one_rank_computes_for_the_requests_routed_to_it(tiny_dir, whole_scenario_tokens,
                                                                                   one_replica_runs, mode):
    engine = engine_for(tiny_dir, MODES[mode])
    assert isinstance(engine, DataParallelEngine) and engine.replicas == 2
    try:
        outputs, placed, steps, padding = run_data_parallel(engine)
        stats = engine.stats()
    finally:
        engine.runner.close()
    # the prefix goes to replica 0 and the prompt that extends it follows it there (a 32-token hit)
    assert placed[:2] == [[0], [0]] and outputs[1][0][1] == 32
    assert placed[2] == [1] * len(CONCURRENT)
    assert [tokens for phase in outputs[1:] for tokens, _ in phase] == whole_scenario_tokens
    assert stats.num_preemptions >= 1 and any(r >= 0 for _, _, r, _ in steps[0])  # a CSA restore, a preemption
    assert sum(padding) > 0 and (stats.padding_steps, stats.padding_tokens) == (sum(padding), sum(padding))
    assert [r.padding_steps for r in stats.replicas] == padding  # an idle replica padded while the other ran
    assert sum(r.padding_tokens for r in stats.replicas) == stats.padding_tokens  # the engine's count = the runner's
    for d in range(2):
        phases = [([p for p, r in zip(prompts, placed[i]) if r == d], n) for i, (prompts, n, _) in enumerate(PHASES)]
        want_outputs, want_steps = one_replica_runs(phases)
        got_outputs = [[o for o, r in zip(phase, placed[i]) if r == d] for i, phase in enumerate(outputs)]
        assert [o for o in got_outputs if o] == [o for o in want_outputs if o]
        assert [s[:3] for s in steps[d]] == [s[:3] for s in want_steps]
        for (*_, got), (*_, want) in zip(steps[d], want_steps):
            assert not torch.isnan(got).any()
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))
