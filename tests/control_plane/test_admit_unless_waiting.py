"""``BlockManager.admit_unless_waiting``: the wait for a prefix being computed and the admission, on one
prefix match, decide exactly as ``should_wait_for_prefix`` followed by ``admit``."""

from atom.bench.control_plane_ops import Workload, _block_manager
from atom.model_engine.sequence import Sequence
from atom.sampling_params import SamplingParams

SHARED = [(j * 13) % 50000 + 1 for j in range(1024)]


def _seq(i: int, block: int) -> Sequence:
    return Sequence(SHARED + [i + 1] * 200, SamplingParams(max_tokens=2), block)


def test_a_request_whose_prefix_is_being_computed_waits_and_then_hits_it():
    bm = _block_manager(Workload("w", 3, 1224, shared=1024), 128, 2)
    first, second = _seq(0, 128), _seq(1, 128)
    assert bm.admit_unless_waiting(first, 512) == 512  # computes blocks 0-3 of the shared prefix this step
    assert bm.admit_unless_waiting(second, 512) is None  # block 0 is being computed: it waits
    assert bm.waits_for_prefix == 1 and second.seq_id not in bm.holdings
    first.num_computed_tokens += 512
    bm.after_step(first)  # blocks 0-3 published
    assert bm.admit_unless_waiting(second, 512) is None  # block 4 is next in the first request's prompt
    assert bm.waits_for_prefix == 2
    bm.grow(first, 512)
    first.num_computed_tokens += 512
    bm.after_step(first)  # the whole shared prefix (8 blocks) published
    assert bm.admit_unless_waiting(second, 512) == 200  # hits 1024 tokens, runs the other 200
    assert second.num_cached_tokens == 1024
    bm.check_integrity([first, second])


def test_with_nothing_being_computed_it_admits_as_admit_does():
    bm = _block_manager(Workload("w", 2, 1224, shared=1024), 128, 2)
    other = _block_manager(Workload("w", 2, 1224, shared=1024), 128, 2)
    a, b = _seq(0, 128), _seq(0, 128)
    assert other.should_wait_for_prefix(b) is False
    assert bm.admit_unless_waiting(a, 700) == other.admit(b, 700) == 700
    assert bm.holdings[a.seq_id].comp.pages == other.holdings[b.seq_id].comp.pages
    assert bm.holdings[a.seq_id].swa.pages == other.holdings[b.seq_id].swa.pages
