"""A tiny real control plane (arena, block manager, scheduler) driven by :class:`LLMEngine` with a
content-checking fake runner."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from atom.config import CacheConfig, Dsv4KvSpec, SchedulerConfig
from atom.kv.block_manager import BlockManager
from atom.kv.kv_holdings import KvHoldings
from atom.kv.kv_layout import KvLayout
from atom.model_engine.llm_engine import EngineStep, LLMEngine
from atom.step_contract import RunnerOutput, ScheduledBatch
from atom.model_engine.scheduler import Scheduler
from atom.model_engine.sequence import Sequence
from atom.sampling_params import SamplingParams
from atom.testing.fake_runner import FakeRunner
from atom.testing.kv_content_model import KvContentModel

TINY = dict(compress_ratios=(0, 4, 16, 4, 16, 4, 0), sliding_window=8, head_dim=32, rope_head_dim=8,
            index_head_dim=16, row_format="fp32", num_mtp_layers=1)


class ObservedRunner(FakeRunner):
    """The fake runner, with ``observers`` called as ``fn(batch)`` right after it ran a step, before the
    scheduler postprocesses it: the moment its tables and the scheduler's must agree."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.observers: list[Callable[[ScheduledBatch], None]] = []

    def execute(self, batch: ScheduledBatch) -> RunnerOutput:
        out = super().execute(batch)
        for fn in self.observers:
            fn(batch)
        return out


@dataclass
class Harness:
    """An engine over a scheduler over a tiny arena, with a content-checking fake runner whose tables
    are compared with the scheduler's after every step it runs."""

    engine: LLMEngine
    runner: ObservedRunner = field(init=False)

    def __post_init__(self) -> None:
        self.runner = self.engine.runner
        self.runner.observers.append(lambda batch: self.assert_runner_tables_match())

    @property
    def sched(self) -> Scheduler:
        return self.engine.scheduler

    @property
    def bm(self) -> BlockManager:
        return self.sched.bm

    def add(self, tokens, max_tokens=4, seq_id=None, **params) -> Sequence:
        seq = Sequence(list(tokens), SamplingParams(max_tokens=max_tokens, **params), self.bm.block_size, seq_id=seq_id)
        self.engine.add_sequence(seq)
        return seq

    def observe(self, fn: Callable[[ScheduledBatch], None]) -> None:
        """Call ``fn(batch)`` after the runner ran each step, before the scheduler postprocesses it."""
        self.runner.observers.append(fn)

    def step(self) -> EngineStep:
        step = self.engine.step_detailed()
        self.sched.check_integrity()
        return step

    def assert_runner_tables_match(self):
        """The runner's delta-built tables equal the scheduler's, for every running request (scheduled
        this step or not), and it keeps no table of a request that is not running."""
        running = {s.seq_id: s for s in self.sched.running}
        assert set(self.runner.tables) == set(running), f"runner tables {sorted(self.runner.tables)}"
        for sid, seq in running.items():
            table, held = self.runner.tables[sid], self.held(seq)
            assert table["compress"] == held.comp.pages, f"seq {sid}: compressed table drifted"
            swa, want = table["swa"] + [-1] * (len(held.swa.pages) - len(table["swa"])), held.swa.pages
            assert swa[:len(want)] == want and set(swa[len(want):]) <= {-1}, \
                f"seq {sid}: SWA table {swa} vs the scheduler's {want}"

    def held(self, seq: Sequence) -> KvHoldings:
        """What the block manager records ``seq`` holding."""
        return self.bm.holdings[seq.seq_id]

    def run(self, max_steps=10_000):
        steps = 0
        while self.sched.has_unfinished():
            self.step()
            steps += 1
            assert steps < max_steps, "scheduler made no progress"
        return steps

    def assert_all_memory_returned(self):
        """No request holds anything; after dropping the cache only retention pins hold pages."""
        bm = self.bm
        assert not self.sched.running and not self.sched.waiting
        assert bm.comp.pool.num_used() == 0 and bm.swa.pool.num_used() == bm.swa.num_pins
        assert bm.slots.num_held() == 0 and bm.arena.num_used("state") == 0
        bm.reset_prefix_cache()
        assert bm.arena.owned_chunks("compress") == 0
        assert bm.arena.num_used("swa") == bm.swa.num_pins
        bm.check_integrity([])


def make_harness(num_chunks=40, chunk_pages=1, max_seqs=4, budget=32, max_model_len=512, full_retain=False,
                 interval=0, pin_fraction=0.25, prefix_caching=True, spec_overrides=None, overlap=True) -> Harness:
    spec = Dsv4KvSpec(**{**TINY, **(spec_overrides or {})})
    limits = SchedulerConfig(max_num_batched_tokens=budget, max_num_seqs=max_seqs, max_model_len=max_model_len,
                             overlap=overlap)
    cache = CacheConfig(chunk_pages=chunk_pages, enable_prefix_caching=prefix_caching, swa_full_retain=full_retain,
                        swa_retention_interval=interval, swa_pin_fraction=pin_fraction)
    bm = BlockManager(KvLayout.for_chunks(spec, num_chunks, limits, cache), cache)
    sched = Scheduler(limits, bm, eos_token_id=None)
    content = KvContentModel.for_spec(spec, lambda sid: sched.by_id[sid].token_ids)
    return Harness(LLMEngine(sched, ObservedRunner(vocab_size=997, content=content)))
