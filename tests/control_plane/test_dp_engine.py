"""The data-parallel control plane: D schedulers, each over its own arena, behind the replica router, stepped
together by one runner of every replica (in-process fake runners here). Requests spread, aborts, ``n``
choices, stop strings and sessions work across replicas; an idle replica pads without hanging; a second
round of prompts returns to the replica that caches each one."""

from __future__ import annotations

import pytest

from atom.config import CacheConfig, Dsv4KvSpec, EngineConfig, ParallelConfig, SchedulerConfig
from atom.kv.block_manager import BlockManager
from atom.kv.kv_layout import KvLayout
from atom.model_engine.dp_engine import DataParallelEngine, check_data_parallel_config
from atom.model_engine.router import ReplicaRouter
from atom.model_engine.scheduler import Scheduler
from atom.model_engine.sequence import Sequence
from atom.sampling_params import SamplingParams
from atom.testing.fake_runner import FakeRunner
from atom.testing.kv_content_model import KvContentModel
from atom.testing.replica_runners import ReplicaRunners
from support.control_plane import TINY, make_harness

VOCAB = 997


class Letters:
    """A tokenizer stand-in: token ``t`` is the letter ``t % 26``."""

    eos_token_id = None

    @staticmethod
    def decode(ids, skip_special_tokens: bool = True) -> str:
        return "".join(chr(97 + t % 26) for t in ids)


def make_engine(replicas=2, policy="prefix", num_chunks=40, budget=32, max_seqs=4, tokenizer=None):
    """A data-parallel engine over ``replicas`` tiny arenas with content-checking fake runners."""
    spec = Dsv4KvSpec(**TINY)
    limits = SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=max_seqs, max_model_len=512)
    cache = CacheConfig()
    schedulers, runners = [], []
    for _ in range(replicas):
        sched = Scheduler(limits, BlockManager(KvLayout.for_chunks(spec, num_chunks, limits, cache), cache),
                          eos_token_id=None)
        content = KvContentModel.for_spec(spec, lambda sid, s=sched: s.by_id[sid].token_ids)
        schedulers.append(sched)
        runners.append(FakeRunner(vocab_size=VOCAB, content=content))
    return DataParallelEngine(schedulers, ReplicaRunners(runners), tokenizer, router=ReplicaRouter(policy))


def run(engine, max_steps=10_000):
    """Step until idle, checking every replica after each step; every output, in order."""
    outputs, steps = [], 0
    while engine.has_unfinished_requests():
        outputs += engine.step()
        engine.check_integrity()
        for sched, runner in zip(engine.schedulers, engine.runner.runners):
            assert {s.seq_id for s in sched.running} <= set(runner.tables)
        steps += 1
        assert steps < max_steps, "no progress"
    return outputs


def finals(outputs):
    return {o.request_id: o for o in outputs if o.finished}


def prompt(i, n=40):
    return [(97 * i + 13 * k) % 900 + 1 for k in range(n)]


def greedy(max_tokens, **kw):
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, **kw)


def test_requests_spread_over_the_replicas_and_get_the_runner_tokens_of_their_positions():
    engine = make_engine()
    rids = [engine.add_request(prompt(i), greedy(5)) for i in range(4)]
    seqs = [engine.sequence(r) for r in rids]
    assert [engine.replica_of(r) for r in rids] == [0, 1, 0, 1]  # equal arenas: fewest waiting tokens wins
    done = finals(run(engine))
    runner = engine.runner.runners[0]
    for rid, seq in zip(rids, seqs):
        assert done[rid].output_token_ids == [runner.token_for(seq.seq_id, 40 + k) for k in range(5)]
        assert done[rid].finish_reason == "length"
    assert [len(r.tables) for r in engine.runner.runners] == [1, 1]  # the last release waits for a batch that runs
    assert engine.runner.padding_steps == 0


def test_an_abort_on_one_replica_streams_one_abort_output_while_the_other_replica_runs_on():
    engine = make_engine()
    keep = engine.add_request(prompt(0), greedy(6))
    drop = engine.add_request(prompt(1), greedy(30))
    assert (engine.replica_of(keep), engine.replica_of(drop)) == (0, 1)
    streamed = engine.step() + engine.step() + engine.step()  # a 32-token chunk, then 8 tokens and 2 samples
    assert engine.abort_request(drop) and not engine.abort_request(drop)
    assert engine.schedulers[1].bm.holdings == {}  # freed at once
    done = finals(run(engine))
    assert done[drop].finish_reason == "abort"
    tokens = [t for o in streamed if o.request_id == drop for t in o.new_token_ids]
    assert len(tokens) == 2 and done[drop].output_token_ids == tokens
    assert done[keep].finish_reason == "length" and len(done[keep].output_token_ids) == 6


def test_every_replica_idle_makes_no_runner_call_and_streams_the_aborts():
    engine = make_engine()
    rids = [engine.add_request(prompt(i), greedy(8)) for i in range(2)]
    engine.step()
    calls = engine.runner.calls
    for rid in rids:
        assert engine.abort_request(rid)
    step = engine.step_detailed()
    assert not step.ran and step.batches == (None, None) and engine.runner.calls == calls
    assert sorted((o.request_id, o.finish_reason) for o in step.outputs) == [(rids[0], "abort"), (rids[1], "abort")]
    assert not engine.has_unfinished_requests()


def test_releases_of_an_idle_replica_reach_its_runner_with_its_next_batch():
    engine = make_engine()
    engine.add_request(prompt(0), greedy(20))
    gone = engine.add_request(prompt(1), greedy(20))
    engine.step()
    gone_id = engine.sequence(gone).seq_id
    engine.abort_request(gone)
    step = engine.step_detailed()
    assert step.batches[1] is None and gone_id in engine.runner.runners[1].tables  # padding: nothing applied yet
    new = Sequence(prompt(2), greedy(3), engine.schedulers[0].block_size)
    engine.add_sequence(new, replica=1)
    step = engine.step_detailed()
    assert step.batches[1].released_ids == (gone_id,) and [s.seq_id for s in step.batches[1].seqs] == [new.seq_id]
    assert gone_id not in engine.runner.runners[1].tables


def test_one_replica_idles_while_the_other_runs_a_long_request_and_its_padding_steps_are_counted():
    engine = make_engine()
    long = engine.add_request(prompt(0, 20), greedy(30))
    short = engine.add_request(prompt(1, 20), greedy(2))
    assert (engine.replica_of(long), engine.replica_of(short)) == (0, 1)
    done = finals(run(engine))
    assert len(done[long].output_token_ids) == 30 and len(done[short].output_token_ids) == 2
    assert engine.runner.calls == 30  # one prefill step (20 tokens fit the budget of 32), then 29 decodes
    stats = engine.stats()
    assert (stats.padding_steps, stats.padding_tokens) == (28, 28)
    assert [(r.padding_steps, r.padding_tokens) for r in stats.replicas] == [(0, 0), (28, 28)]


def test_the_n_choices_of_a_request_share_one_replica_and_its_prefix_cache():
    engine = make_engine()
    other = engine.add_request(prompt(5, 64), greedy(2))  # makes replica 1 the emptier one for the next prompt
    first = engine.add_request(prompt(0, 64), greedy(4), "r-0")
    second = engine.add_request(prompt(0, 64), greedy(4), "r-1", place_with=first)
    assert [engine.replica_of(r) for r in (other, first, second)] == [0, 1, 1]
    done = finals(run(engine))
    one = make_harness()
    a = one.engine.add_request(prompt(0, 64), greedy(4))
    b = one.engine.add_request(prompt(0, 64), greedy(4))
    want = finals(run_single(one))
    assert (done["r-0"].num_cached_tokens, done["r-1"].num_cached_tokens) == \
           (want[a].num_cached_tokens, want[b].num_cached_tokens)
    assert done["r-1"].num_cached_tokens > 0


def run_single(harness):
    outputs = []
    while harness.engine.has_unfinished_requests():
        outputs += harness.step().outputs
    return outputs


def test_a_stop_string_ends_its_request_on_either_replica():
    engine = make_engine(tokenizer=Letters())
    runner, wanted = engine.runner.runners[0], {}
    for i in range(2):
        seq_id = 50_000 + i  # chosen, so the text the fake runner will produce is known in advance
        text = Letters.decode([runner.token_for(seq_id, 40 + k) for k in range(20)])
        stop = text[3 + i:5 + i]
        rid = engine.add_sequence(Sequence(prompt(i), greedy(20, stop=(stop,)), engine.schedulers[0].block_size,
                                           seq_id=seq_id))
        wanted[rid] = text[:text.index(stop)]
    assert [engine.replica_of(r) for r in wanted] == [0, 1]
    done = finals(run(engine))
    assert {rid: (done[rid].finish_reason, done[rid].text) for rid in wanted} == \
           {rid: ("stop", text) for rid, text in wanted.items()}


def two_rounds(engine_add, run_fn, prompts):
    """Cached tokens per prompt of a second round that submits ``prompts`` again in reverse order."""
    for p in prompts:
        engine_add(p)
    run_fn()
    rids = {i: engine_add(prompts[i]) for i in reversed(range(len(prompts)))}
    done = finals(run_fn())
    return [done[rids[i]].num_cached_tokens for i in range(len(prompts))]


PROMPTS = [prompt(i, 64) for i in range(4)]


def test_a_second_round_in_another_order_hits_the_replica_holding_each_prompt_as_one_replica_would():
    engine = make_engine(policy="prefix")
    first = {}
    engine_add = lambda p: engine.add_request(p, greedy(1))
    for i, p in enumerate(PROMPTS):
        first[i] = engine.replica_of(engine_add(p))
    run(engine)
    second = {i: engine.add_request(PROMPTS[i], greedy(1)) for i in reversed(range(4))}
    assert {i: engine.replica_of(r) for i, r in second.items()} == first
    assert sorted(set(first.values())) == [0, 1]
    done = finals(run(engine))
    got = [done[second[i]].num_cached_tokens for i in range(4)]

    one = make_harness()
    want = two_rounds(lambda p: one.engine.add_request(p, greedy(1)), lambda: run_single(one), PROMPTS)
    assert got == want == [48, 48, 48, 48]  # whole blocks of 16 before the last token, bounded by the window
    assert engine.stats().prefix.reused == sum(want)


def test_round_robin_routing_sends_the_second_round_elsewhere_and_hits_less():
    rr = make_engine(policy="round-robin")
    got = two_rounds(lambda p: rr.add_request(p, greedy(1)), lambda: run(rr), PROMPTS)
    prefix = make_engine(policy="prefix")
    best = two_rounds(lambda p: prefix.add_request(p, greedy(1)), lambda: run(prefix), PROMPTS)
    assert got == [0, 0, 0, 0] and sum(best) == 4 * 48


def test_a_session_goes_back_to_its_replica_even_when_another_is_emptier():
    engine = make_engine()
    a = engine.add_request(prompt(0), greedy(2), session="alice")
    b = engine.add_request(prompt(1), greedy(2), session="bob")
    run(engine)
    big = engine.add_request(prompt(2, 200), greedy(40))  # lands on replica 0 and fills some of it
    engine.step()
    later = engine.add_request(prompt(3), greedy(2), session="alice")
    cold = engine.add_request(prompt(4), greedy(2))
    assert (engine.replica_of(big), engine.replica_of(later), engine.replica_of(cold)) == (0, 0, 1)
    assert {a, b}.isdisjoint(engine._requests)


def test_stats_sum_the_replicas_and_show_each_ones_arena_queue_and_hit_tokens():
    engine = make_engine()
    for p in PROMPTS[:2]:
        engine.add_request(p, greedy(1))
    run(engine)
    rids = [engine.add_request(p, greedy(3)) for p in (PROMPTS[0], prompt(9, 30), prompt(8, 30))]
    assert [engine.replica_of(r) for r in rids] == [0, 1, 1]  # its prefix; then the fewest waiting tokens
    engine.step()  # admits all three (16 tokens after the hit on replica 0; 30 + 2 on replica 1)
    stats = engine.stats()
    per = stats.replicas
    assert [(r.prompt_tokens, r.hit_tokens, r.num_running, r.num_waiting) for r in per] == [(128, 48, 1, 0),
                                                                                            (124, 0, 2, 0)]
    assert (stats.prefix.prompt_tokens, stats.prefix.reused) == (252, 48)
    assert (stats.num_running, stats.num_waiting) == (sum(r.num_running for r in per), sum(r.num_waiting for r in per))
    for owner, nbytes in stats.arena_bytes.items():
        assert nbytes == sum(r.arena_bytes[owner] for r in per)
    assert sum(stats.arena_bytes.values()) == 2 * engine.schedulers[0].bm.arena.layout.arena_bytes  # two arenas


@pytest.mark.parametrize("change, flag", [
    (dict(scheduler=SchedulerConfig(speculative_num_tokens=2)), "--speculative-num-tokens"),
    (dict(cache=CacheConfig(gpu_memory_utilization=0.9)), "--gpu-memory-utilization"),
    (dict(parallel=ParallelConfig(data_parallel_size=2, distributed_executor_backend="external_launcher")),
     "--distributed-executor-backend"),
])
def test_data_parallelism_refuses_what_it_does_not_support_naming_the_flag(change, flag):
    config = EngineConfig(**{"parallel": ParallelConfig(data_parallel_size=2), **change})
    with pytest.raises(ValueError, match=flag):
        check_data_parallel_config(config)
    check_data_parallel_config(EngineConfig(**{**change, "parallel": ParallelConfig()}))  # one replica: allowed here


def test_an_engine_refuses_schedulers_that_differ_or_a_runner_of_another_size():
    engine = make_engine()
    with pytest.raises(ValueError, match="3 replicas but 2 schedulers"):
        DataParallelEngine(engine.schedulers, ReplicaRunners([FakeRunner()] * 3))
    with pytest.raises(ValueError, match="replica=2 is not one of the 2 replicas"):
        engine.add_sequence(Sequence(prompt(0), greedy(1), 16), replica=2)
