"""Data-parallel replicas in the trace simulator: D arenas of budget/D behind the real router, stepping in
lockstep. Toy size: the real V4-Flash geometry at a 1 GiB budget, 16 live requests per replica."""

from __future__ import annotations

import re

import pytest

import atom.bench.simulate as sim
from atom.bench.sim_arenas import ARENA
from atom.bench.sim_replicas import compare_routers, format_replica_table, replica_config, replica_summary_line, \
    run_replicas
from atom.bench.sim_workloads import Segment, Session, Turn, agentic
from support.usage_errors import assert_usage_error

SMALL = sim.SimConfig(budget_bytes=1 << 30, max_num_seqs=16, max_batched_tokens=2048, max_model_len=32768)
AGENTS = tuple(agentic(4, 4.0, 5))  # 4 sessions, 61 turns, a shared 4096-token system prompt


def test_one_replica_behind_any_router_is_exactly_the_single_arena():
    single = sim.run_trace(AGENTS, ARENA, SMALL)
    for policy in ("prefix", "round-robin"):
        one = run_replicas(AGENTS, SMALL, 1, policy)
        assert (one.served_tokens, one.modelled_s, one.hit_tokens, one.prompt_tokens, one.steps, one.finished) == \
            (single.served_tokens, single.modelled_s, single.hit_tokens, single.prompt_tokens, single.steps,
             single.finished)
        assert one.routed == [61] and one.padding_steps == 0 and one.split_sessions == 0 and one.imbalance == 1.0


def test_each_replica_gets_its_share_of_the_budget():
    assert replica_config(SMALL, 4).budget_bytes == (1 << 30) // 4
    assert replica_config(SMALL, 4).max_num_seqs == 16
    with pytest.raises(ValueError, match="replicas must be >= 1"):
        replica_config(SMALL, 0)


def test_the_prefix_router_keeps_sessions_whole_and_hits_more_than_round_robin():
    prefix, rr, least = (run_replicas(AGENTS, SMALL, 2, p) for p in ("prefix", "round-robin", "least-loaded"))
    for r in (prefix, rr, least):
        assert r.finished == 61 and r.aborted == 0 and sum(r.routed) == 61
    assert prefix.split_sessions == 0 and rr.split_sessions == 4
    assert rr.routed == [31, 30]  # requests in turn
    assert prefix.hit_rate > rr.hit_rate and prefix.hit_rate > least.hit_rate
    assert prefix.prompt_tokens == rr.prompt_tokens == least.prompt_tokens  # the same trace was served
    assert (prefix.hit_tokens, rr.hit_tokens) == (553856, 519424)  # the single arena: 562048


def test_a_lone_session_leaves_the_other_replica_padding_every_step():
    lone = (Session(0, "agentic", 0.0, (Turn((Segment(3, 700),), 20), Turn((Segment(4, 90),), 10, 0.5))),)
    r = run_replicas(lone, SMALL, 2, "prefix")
    assert r.routed == [2, 0] and r.finished == 2
    assert r.padding_steps == r.steps > 0  # replica 1 had nothing to run at every step
    assert r.imbalance == 2.0 and r.step_imbalance == pytest.approx(2.0)


def test_the_report_prints_each_router_and_ends_with_the_hit_rates_of_the_first():
    # one agentic session (15 turns): the layout of the report does not depend on the trace's size, and
    # routing on the 4-session trace is checked above (0.45 s of CPU here instead of 1.2 s)
    rep = compare_routers("flash", "agentic", tuple(agentic(1, 4.0, 5)), SMALL, 2, ["prefix", "round-robin"],
                          log=lambda m: None)
    table = format_replica_table(rep, 1.0)
    assert table.splitlines()[0] == "## flash / agentic: 2 replicas of 0.5 GiB against one arena of 1 GiB"
    assert [line.split(" | ")[0] for line in table.splitlines()[3:]] == ["| prefix", "| round-robin", "| single arena"]
    line = replica_summary_line([rep], "prefix")
    m = re.fullmatch(r"hit_rate_agentic=([\d.]+) single_arena_hit_rate_agentic=([\d.]+)", line)
    assert m and float(m.group(1)) == round(rep.results["prefix"].hit_rate, 4)
    assert float(m.group(2)) == round(rep.single.hit_rate, 4)
    with pytest.raises(ValueError, match="unknown router policy 'random'"):
        compare_routers("flash", "agentic", AGENTS, SMALL, 2, ["random"], log=lambda m: None)


def test_the_command_line_runs_the_routers_and_ends_with_the_first_ones_hit_rates(capsys):
    assert sim.main(["--quick", "--replicas", "2", "--router", "prefix", "--workloads", "agentic"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[0] == "## flash / agentic: 2 replicas of 20 GiB against one arena of 40 GiB"
    assert [line.split(" | ")[0] for line in out[3:5]] == ["| prefix", "| single arena"]
    assert re.fullmatch(r"hit_rate_agentic=0\.\d{4} single_arena_hit_rate_agentic=0\.\d{4}", out[-1])


@pytest.mark.parametrize("argv, message", [
    (["--router", "prefix"], "--router needs --replicas"),
    (["--replicas", "0"], "'0' must be > 0"),
    (["--replicas", "2", "--router", "cache"], "invalid choice: 'cache'"),
    (["--replicas", "2", "--host-kv-gib", "8"], "--host-kv-gib is not simulated with --replicas"),
])
def test_bad_replica_options_are_refused_naming_the_option(argv, message, capsys):
    assert_usage_error(sim.main, argv, message, capsys)
