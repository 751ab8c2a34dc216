"""The engine-neutral control-plane traces, and atom's block manager replaying them."""

import math

import pytest

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


def test_atom_replays_a_shared_prefix_trace_waiting_a_step_for_the_prefix_being_computed():
    steps = build_steps(TOY, decode_steps=2, chunk=400)
    rec = replay(AtomReplay(TOY, 128, 2), steps)
    # requests 1 and 2 arrive while request 0 computes the shared prefix: each waits for it to be
    # published and hits its two full blocks (256 tokens) instead of computing them again
    assert rec.hit_tokens == 512
    assert len(rec.ops["admit"]) == 3 and len(rec.ops["free"]) == 3 and len(rec.ops["decode"]) == 6
    assert rec.steps == []  # operations timed: steps are timed in a replay of their own
    whole = replay(AtomReplay(TOY, 128, 2), steps, time_ops=False)
    assert whole.hit_tokens == 512 and whole.ops == {}
    assert len(whole.steps) == 5 and all(t > 0 for t in whole.steps)


@pytest.mark.slow  # timed repetitions of every operation: about 3 s of CPU
def test_without_a_peer_the_comparison_summarises_atom_alone():
    atom, vllm = compare(TOY, 128, 2, reps=2, peer=False)
    assert vllm is None
    assert atom["hits"] == (512.0, 0.0)  # requests 1 and 2 wait a step for request 0's prefix
    assert set(atom) == {"admit", "decode", "free", "step", "hits"}
    assert all(not math.isnan(mid) and mid > 0 for key, (mid, _) in atom.items() if key != "hits")


class _Deferring:
    """A stand-in engine that keeps request 1 waiting once, to check the replay's retry."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int]] = []
        self.waited = False

    def admit(self, i, max_new):
        self.calls.append(("admit", i))
        if i == 1 and not self.waited:
            self.waited = True
            return None
        return 0, max_new

    def grow(self, i, max_new, prefill):
        self.calls.append(("grow", i))
        return max_new

    def after(self, i, tokens):
        pass

    def end_step(self):
        self.calls.append(("end", -1))

    def free(self, i):
        self.calls.append(("free", i))


@pytest.mark.parametrize("time_ops", [True, False])
def test_a_deferred_admission_is_retried_first_in_the_next_step(time_ops):
    engine = _Deferring()
    replay(engine, [[("admit", 0, 4), ("admit", 1, 4)], [("chunk", 0, 4), ("admit", 2, 4)]], time_ops=time_ops)
    assert engine.calls == [("admit", 0), ("admit", 1), ("end", -1),
                            ("grow", 0), ("admit", 1), ("admit", 2), ("end", -1)]


@pytest.mark.parametrize("time_ops", [True, False])
def test_an_admission_still_deferred_when_the_trace_ends_is_an_error(time_ops):
    with pytest.raises(RuntimeError, match=r"still deferred when the trace ended: \[\('admit', 1, 4\)\]"):
        replay(_Deferring(), [[("admit", 0, 4), ("admit", 1, 4)]], time_ops=time_ops)


def test_vllm_replays_the_shared_prefix_trace_with_the_hits_its_own_statistics_count():
    pytest.importorskip("vllm.v1.core.kv_cache_manager",
                        reason="the optional peer vLLM is not installed (atom/bench/install_peer.sh)")
    from atom.bench.control_plane_engines import VllmReplay

    engine = VllmReplay(TOY, 128, 2)
    rec = replay(engine, build_steps(TOY, decode_steps=2, chunk=400))
    # vLLM registers the blocks request 0 computes when it allocates them: requests 1 and 2 hit the
    # shared prefix's two blocks at once; the prefix-cache stats drained once a step count the same
    assert rec.hit_tokens == 512
    assert engine.stats_hits == 512
