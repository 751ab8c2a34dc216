"""The simulator's host tier: the real block manager over the host pool turns a prefix the device evicted
into a hit, the copies are counted in bytes and time, and the CLI checks its new values.

Toy size: a 256 MiB device budget at the V4-Flash geometry, 4 live requests, a 1 GiB host tier.
"""

from __future__ import annotations

import pytest

import atom.bench.simulate as sim
from atom.bench.sim_arenas import ARENA, ARENA_HOST
from atom.bench.sim_workloads import Segment, Session, Turn
from support.usage_errors import assert_usage_error

CFG = sim.SimConfig(budget_bytes=256 << 20, max_num_seqs=4, max_batched_tokens=2048, max_model_len=16384,
                    host_kv_bytes=1 << 30, check_every=1)


def evicting_trace() -> list[Session]:
    """A 6,000-token prompt, eight unrelated 6,000-token prompts that evict it from the device, then the
    first prompt's session again (its history + 100 new tokens) 30 modelled seconds later."""
    first = Session(1, "agentic", 0.0, (Turn((Segment(77, 6000),), 32), Turn((Segment(78, 100),), 32, think_s=30.0)))
    flood = [Session(100 + i, "chat", 1.0 + 0.1 * i, (Turn((Segment(1000 + i, 6000),), 32),)) for i in range(8)]
    return [first, *flood]


def test_the_host_tier_restores_the_evicted_prefix_that_the_device_alone_recomputes():
    device = sim.run_trace(evicting_trace(), ARENA, CFG)
    host = sim.run_trace(evicting_trace(), ARENA_HOST, CFG)
    # the second turn's prompt is 6,000 + 32 + 100 tokens; its 47 whole blocks (6,016 tokens) were cached
    assert device.hits_by_kind["agentic"] == [0, 12132]
    assert device.counters.lost_to_evicted_kv == 6016
    assert host.hits_by_kind["agentic"] == [6016, 12132]
    assert (host.counters.reused_from_host, host.counters.lost_to_evicted_kv) == (6016, 0)
    # restored: 47 compressed blocks and the SWA block that ends the hit, at their exact bytes
    assert host.host_bytes_in == 47 * 492832 + 4149248
    assert host.host_bytes_out > host.host_bytes_in  # every evicted published block was written back
    assert host.throughput > device.throughput
    assert (device.host_bytes_in, device.host_bytes_out, device.copy_wait_s) == (0, 0, 0.0)


def test_without_host_bytes_the_comparison_has_no_host_policy():
    cfg = sim.SimConfig(budget_bytes=256 << 20, max_num_seqs=4, max_batched_tokens=2048, max_model_len=16384)
    rep = sim.compare("flash", "agentic", evicting_trace()[:1], cfg, [0.5], log=lambda m: None)
    assert ARENA_HOST.name not in rep.results and ARENA.name in rep.results


@pytest.mark.parametrize("argv, message", [
    (["--host-kv-gib", "-1"], "--host-kv-gib: '-1' must be >= 0"),
    (["--pcie-gbps", "0"], "--pcie-gbps: '0' must be > 0"),
    (["--attn-gbps", "x"], "--attn-gbps: 'x' is not a number"),
    (["--token-us", "0"], "--token-us: '0' must be > 0"),
])
def test_bad_cost_and_host_values_are_argparse_errors(argv, message, capsys):
    assert_usage_error(sim.main, argv, message, capsys)
