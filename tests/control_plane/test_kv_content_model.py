"""The content model itself: it checks the rows a spec has, and only those."""

import pytest

from atom.config import Dsv4KvSpec
from atom.model_engine.sequence import SequenceStatus
from atom.testing.kv_content_model import KvContentError, KvContentModel

from support.control_plane import TINY

SWA_ONLY = {"compress_ratios": (0,) * 7}


def test_requests_on_a_spec_without_compressed_layers_read_no_compressed_rows(harness):
    # every compressed table entry is -1 there: the model used to file all requests' block ends under
    # page -1 and report the second request's read of it as "stale or foreign"
    h = harness(spec_overrides=SWA_ONLY)
    assert not h.bm.has_compressed
    seqs = [h.add([(7 * i + salt) % 997 + 1 for i in range(40)], max_tokens=6) for salt in (1, 2, 3)]
    h.run()
    assert [s.status for s in seqs] == [SequenceStatus.FINISHED_LENGTH] * 3
    assert h.runner.content.comp_rows == {} and h.runner.content.reads > 0
    h.assert_all_memory_returned()


def test_for_spec_follows_the_spec_s_compressed_and_csa_layers():
    tokens = lambda sid: []  # noqa: E731 - no step runs
    plain = KvContentModel.for_spec(Dsv4KvSpec(**{**TINY, **SWA_ONLY}), tokens)
    full = KvContentModel.for_spec(Dsv4KvSpec(**TINY), tokens)
    assert (plain.has_compressed, plain.needs_state) == (False, False)
    assert (full.has_compressed, full.needs_state) == (True, True)


def test_with_compressed_layers_a_read_through_a_missing_compressed_page_is_named(harness):
    h = harness(overlap=False)  # overlapped, the next step would run before the table is corrupted
    seq = h.add(range(1, 30), max_tokens=2)
    h.step()  # block 0 was written and its compressed page recorded
    table = h.runner.tables[seq.seq_id]["compress"]
    table[0] = -1  # the runner lost the page of block 0
    with pytest.raises(KvContentError, match="compressed block 0 has no page"):
        h.step()
