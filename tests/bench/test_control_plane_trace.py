"""The engine-neutral control-plane traces, and atom's block manager replaying them."""

import math

from atom.bench.control_plane_engines import AtomReplay
from atom.bench.control_plane_side import compare
from atom.bench.control_plane_trace import Trace, build_steps, replay

TOY = Trace("toy", 3, 300, shared=256)


def test_a_trace_decodes_first_then_continues_prefill_then_admits_within_the_chunk_budget():
    steps = build_steps(TOY, decode_steps=2, chunk=400)
    assert steps[0] == [("admit", 0, 300), ("admit", 1, 100)]
    assert steps[1] == [("decode", 0, 1), ("chunk", 1, 200), ("admit", 2, 200)]
    assert steps[2] == [("decode", 0, 1), ("decode", 1, 1), ("chunk", 2, 100), ("free", 0, 0)]
    assert steps[3] == [("decode", 1, 1), ("decode", 2, 1), ("free", 1, 0)]
    assert steps[4] == [("decode", 2, 1), ("free", 2, 0)]
    assert len(steps) == 5


def test_atom_replays_a_shared_prefix_trace_hitting_the_prefix_published_in_an_earlier_step():
    steps = build_steps(TOY, decode_steps=2, chunk=400)
    rec = replay(AtomReplay(TOY, 128, 2), steps)
    # request 1 is admitted in the step that computes request 0's prefix: it misses;
    # request 2 arrives a step later and hits the two full shared blocks (256 tokens)
    assert rec.hit_tokens == 256
    assert len(rec.ops["admit"]) == 3 and len(rec.ops["free"]) == 3 and len(rec.ops["decode"]) == 6
    assert len(rec.steps) == 5 and all(t > 0 for t in rec.steps)


def test_without_a_peer_the_comparison_summarises_atom_alone():
    atom, vllm = compare(TOY, 128, 2, reps=2, peer=False)
    assert vllm is None
    assert atom["hits"] == (0.0, 0.0)  # all three are admitted in the step that computes the prefix
    assert set(atom) == {"admit", "decode", "free", "step", "hits"}
    assert all(not math.isnan(mid) and mid > 0 for key, (mid, _) in atom.items() if key != "hits")
