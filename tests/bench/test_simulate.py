"""The trace simulator: its comparison arenas, its determinism, its CLI, and real multi-turn reuse.

Everything runs the real scheduler, block manager and fake runner over the real V4-Flash geometry,
at a small byte budget (1 GiB, 16 live requests) so that memory binds within a few hundred steps.
"""

from __future__ import annotations

import dataclasses
import re
import sys

import pytest

import atom.bench.simulate as sim
from atom.bench.capacity import atom_style_chunks, ring_state_bytes
from atom.bench.sim_arenas import (ARENA_RESERVED, OracleKvArena, SplitKvArena, atom_style_layout, reserved_state_layout, split_arena,
                                   usable_bytes)
from atom.bench.sim_workloads import Segment, Session, Turn, agentic, build_trace, chat, long_context, request_id
from atom.kv.chunk_arena import ArenaEmpty
from atom.kv.page_map import COMPRESS, STATE, SWA
from support.usage_errors import assert_usage_error

SMALL = sim.SimConfig(budget_bytes=1 << 30, max_num_seqs=16, max_batched_tokens=2048, max_model_len=32768)


def small_trace() -> tuple[Session, ...]:
    """Chat, a shared-prefix pair and two agentic sessions on one timeline (prompts < 32K)."""
    shared = Segment(99, 3000)
    one_shot = [Session(1000 + i, "sysprompt", 0.01 * i, (Turn((shared, Segment(500 + i, 200)), 64),))
                for i in range(6)]
    return tuple(sorted([*chat(24, 40.0, 3), *one_shot, *agentic(3, 4.0, 5, sid0=2000)],
                        key=lambda s: (s.arrival, s.sid)))


def spy_on_evictions(monkeypatch: pytest.MonkeyPatch, check) -> list:
    """Patch the simulator's block-manager builder so every eviction calls ``check(arena, want)``,
    where ``want`` = the (swa, compress, state) pages of the make-room call that evicts. Returns the log."""
    log: list = []
    real = sim.build_block_manager

    def build(policy, layout, cfg):
        bm = real(policy, layout, cfg)
        want: list[tuple[int, int, int]] = []
        make_room = bm._make_room

        def spying_make_room(swa: int, comp: int, state: int = 0, within_pins: bool = False) -> None:
            want.append((swa, comp, state))
            try:
                make_room(swa, comp, state, within_pins)
            finally:
                want.pop()
        bm._make_room = spying_make_room
        for pool in (bm.comp.pool, bm.swa.pool):
            def evict(bid: int, _orig=pool.evict, _owner=pool.owner) -> None:
                assert want, "a cached block was evicted outside of making room"
                log.append(check(bm.arena, _owner, want[-1]))
                _orig(bid)
            pool.evict = evict
        return bm
    monkeypatch.setattr(sim, "build_block_manager", build)
    return log


def test_the_split_arena_never_lends_a_page_one_pool_frees_to_the_other():
    layout = sim.base_layout(SMALL)
    lay, arena = split_arena(layout, 0.1)
    assert arena.lends_between_owners is False
    swa_cap, comp_cap = arena.capacity(SWA), arena.capacity(COMPRESS)
    assert lay.max_swa_pages == swa_cap and lay.max_compressed_pages == comp_cap
    arena.alloc(swa=list(range(swa_cap)), compress=list(range(comp_cap)))
    arena.free(COMPRESS, range(comp_cap))
    assert arena.available(COMPRESS) == comp_cap and arena.available(SWA) == 0
    with pytest.raises(ArenaEmpty):
        arena.alloc(swa=[swa_cap])
    arena.check_integrity()


def test_a_fixed_split_evicts_only_from_a_pool_that_lacks_pages(monkeypatch):
    def check(arena: SplitKvArena, owner: str, want: tuple[int, int, int]) -> bool:
        need = dict(zip((SWA, COMPRESS), want))[owner]
        return arena.available(owner) < need
    log = spy_on_evictions(monkeypatch, check)
    res = sim.run_trace(small_trace(), sim.fixed(0.1, retain=True), SMALL)
    assert res.evictions > 0 and len(log) == res.evictions
    assert all(log)


def test_the_oracle_never_evicts_while_the_requested_bytes_remain_free(monkeypatch):
    def check(arena: OracleKvArena, owner: str, want: tuple[int, int, int]) -> tuple[int, int]:
        return arena.free_bytes(), arena.bytes_for(*want)
    log = spy_on_evictions(monkeypatch, check)
    res = sim.run_trace(small_trace(), sim.Policy("oracle+retain", "oracle", full_retain=True), SMALL)
    assert res.evictions > 0 and len(log) == res.evictions
    assert all(free < need for free, need in log)


@pytest.mark.parametrize("policy", [sim.ARENA_POLICIES[2], sim.fixed(0.2), sim.OTHER_POLICIES[0],
                                    sim.OTHER_POLICIES[3], ARENA_RESERVED], ids=lambda p: p.name)
def test_every_policy_keeps_the_control_planes_integrity_checks_on_a_loaded_trace(policy):
    res = sim.run_trace(small_trace(), policy, dataclasses.replace(SMALL, check_every=7))
    assert res.finished == sum(len(s.turns) for s in small_trace())
    assert res.aborted == 0 and res.steps > 7


def test_a_tiny_trace_gives_the_same_results_twice():
    a = sim.run_trace(small_trace(), sim.ARENA_POLICIES[1], SMALL)
    b = sim.run_trace(small_trace(), sim.ARENA_POLICIES[1], SMALL)
    skip = {"wall_s", "speed_wall_s"}
    fields = [f.name for f in dataclasses.fields(a) if f.name not in skip]
    assert {f: getattr(a, f) for f in fields} == {f: getattr(b, f) for f in fields}
    assert a.served_tokens > 0 and a.preemptions + a.evictions > 0


def test_agentic_turns_reuse_the_previous_turns_generated_blocks_only_with_prefix_caching():
    sessions = tuple(agentic(3, 4.0, 11))
    on = sim.run_trace(sessions, sim.ARENA, SMALL)
    off = sim.run_trace(sessions, sim.ARENA, dataclasses.replace(SMALL, prefix_caching=False))
    turns = sum(len(s.turns) for s in sessions)
    assert on.finished == off.finished == turns
    assert on.kind_hit_rate("agentic") > 0.5
    assert off.kind_hit_rate("agentic") == 0.0 and off.counters.reused == 0


def test_a_later_turn_re_sends_the_previous_turns_actual_tokens(monkeypatch):
    prompts: dict[int, list[int]] = {}
    real_add = sim.Scheduler.add

    def add(self, seq):
        prompts[seq.seq_id] = list(seq.token_ids)
        real_add(self, seq)
    monkeypatch.setattr(sim.Scheduler, "add", add)
    (session,) = agentic(1, 1.0, 2)
    sim.run_trace((session,), sim.ARENA, SMALL)
    runner = sim.FakeRunner(vocab_size=sim.VOCAB)
    first, second = prompts[request_id(session.sid, 0)], prompts[request_id(session.sid, 1)]
    answer = [runner.token_for(request_id(session.sid, 0), len(first) + i) for i in range(session.turns[0].max_tokens)]
    assert second[:len(first) + len(answer)] == first + answer
    assert len(second) == len(first) + len(answer) + sum(s.length for s in session.turns[1].new)


def test_the_atom_style_layout_takes_its_chunks_from_the_capacity_module():
    layout = sim.base_layout(SMALL)
    atom = atom_style_layout(layout)
    assert (atom.num_chunks, atom.compress_pages_per_chunk) == atom_style_chunks(layout.spec, usable_bytes(layout))
    assert atom.chunk_pages == 1 and atom.arena_bytes <= usable_bytes(layout)


def test_the_reserved_state_arena_takes_the_old_ring_states_off_the_budget_and_keeps_the_chunk_shape():
    layout = sim.base_layout(SMALL)
    old = reserved_state_layout(layout)
    assert ring_state_bytes(layout.spec) == 12_206_080  # V4-Flash: CSA rings + a 128-row HCA ring per HCA layer
    assert old.num_chunks == (2**30 - 16 * 12_206_080) // layout.chunk_bytes == 70 and layout.num_chunks == 86
    assert (old.chunk_pages, old.compress_pages_per_chunk, old.chunk_bytes) == \
        (layout.chunk_pages, layout.compress_pages_per_chunk, layout.chunk_bytes)
    assert old.reserved_state_slots == 16 and layout.reserved_state_slots == 0
    bm = sim.build_block_manager(ARENA_RESERVED, layout, SMALL)
    assert bm.arena.available(STATE) == 16 and bm.arena.num_free_chunks() == 70  # the state pool is not chunks


def test_workloads_are_seeded_and_have_the_documented_shapes():
    assert build_trace("mix", 0.1, 4) == build_trace("mix", 0.1, 4)
    assert build_trace("mix", 0.1, 4) != build_trace("mix", 0.1, 5)
    docs = [s.turns[0].new[0].length for s in long_context(40, 1.0, 1)]
    assert min(docs) >= 32768 and max(docs) <= 262144 and len(set(docs)) < len(docs)
    sessions = agentic(30, 1.0, 1)
    assert {len(s.turns) for s in sessions} <= set(range(5, 21))
    assert len({s.turns[0].new[0] for s in sessions}) == 1
    kinds = {s.kind for s in build_trace("mix", 0.1, 0)}
    assert kinds == {"chat", "long", "agentic", "sysprompt"}
    sids = [s.sid for s in build_trace("mix", 0.2, 0)]
    assert len(set(sids)) == len(sids)


@pytest.mark.slow
def test_the_quick_cli_run_prints_the_final_line_with_parseable_floats(tmp_path, capsys):
    png = tmp_path / "sim.png"
    assert sim.main(["--quick", "--workloads", "agentic", "sysprompt", "--plot", str(png)]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    m = re.fullmatch(r"throughput_vs_best_fixed_min=(\S+) hit_rate_agentic=(\S+) utilisation_mean=(\S+)", last)
    assert m, last
    values = [float(v) for v in m.groups()]
    assert values[0] > 0 and 0 < values[1] <= 1
    assert png.stat().st_size > 10_000


@pytest.mark.parametrize("argv, message", [
    (["--shares", "1.5"], "must be > 0 and < 1.0"),
    (["--budget-gib", "0"], "must be > 0"),
    (["--budget-gib", "0.1"], "cannot hold one request"),
    (["--workloads", "nope"], "invalid choice"),
    (["--scale", "x"], "is not a number"),
    (["--seed", "-1"], "must be >= 0"),
    (["--max-num-seqs", "2.5"], "is not an integer"),
])
def test_bad_cli_values_are_argparse_errors_that_say_what_is_wrong(argv, message, capsys):
    assert_usage_error(sim.main, argv, message, capsys)


def test_a_session_whose_history_outgrows_the_model_length_ends_there_and_is_counted():
    (session,) = agentic(1, 1.0, 2)
    cfg = dataclasses.replace(SMALL, max_model_len=8192)
    res = sim.run_trace((session,), sim.ARENA, cfg)
    assert res.aborted == 1
    assert 1 <= res.finished < len(session.turns)


def test_without_matplotlib_the_plot_is_skipped_and_nothing_is_written(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    path = tmp_path / "sim.png"
    assert sim.plot([], str(path)) is False
    assert not path.exists()
