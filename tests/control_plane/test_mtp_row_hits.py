"""With the MTP layer's rows in the arena (speculative decoding), a prefix hit boundary also needs the
request's token after it to be the one the boundary block's last MTP row was computed with."""

import pytest

from atom.config import CacheConfig, Dsv4KvSpec, SchedulerConfig
from atom.kv.block_manager import BlockManager
from atom.kv.kv_layout import KvLayout
from atom.model_engine.scheduler import Scheduler
from atom.model_engine.sequence import Sequence
from atom.sampling_params import SamplingParams
from atom.testing.fake_runner import FakeRunner
from atom.testing.kv_content_model import KvContentModel

from support.control_plane import TINY

SHARED = [(53 * i + 7) % 500 + 1 for i in range(48)]  # three blocks of 16


def hit_after(first: list[int], second: list[int], mtp_rows: bool) -> int:
    """Tokens the second prompt reuses after the first one ran (full retain, a roomy arena)."""
    spec = Dsv4KvSpec(**TINY)
    limits = SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=4, max_model_len=256)
    cache = CacheConfig(chunk_pages=1, swa_full_retain=True)
    bm = BlockManager(KvLayout.for_chunks(spec, 40, limits, cache), cache, mtp_rows=mtp_rows)
    sched = Scheduler(limits, bm, None)
    runner = FakeRunner(vocab_size=997, content=KvContentModel.for_spec(spec, lambda sid: sched.by_id[sid].token_ids))
    for prompt in (first, second):
        seq = Sequence(prompt, SamplingParams(max_tokens=2), spec.block_size)
        sched.add(seq)
        while sched.has_unfinished():
            batch = sched.schedule()
            sched.postprocess(batch, runner.execute(batch))
            sched.check_integrity()
    return seq.num_cached_tokens


def test_a_prompt_that_leaves_the_shared_prefix_at_a_block_boundary_hits_one_block_less():
    first, second = SHARED + [1, 2, 3], SHARED + [4, 5, 6]
    assert hit_after(first, second, mtp_rows=False) == 48
    assert hit_after(first, second, mtp_rows=True) == 32  # block 2's last MTP row was computed for token 1


def test_a_prompt_that_leaves_the_shared_prefix_inside_a_block_keeps_its_whole_hit():
    first, second = SHARED + [1, 2, 3], SHARED + [1, 2, 9]
    assert hit_after(first, second, mtp_rows=True) == 48


def test_mtp_rows_need_a_layout_that_counts_the_mtp_layer():
    spec = Dsv4KvSpec(**{**TINY, "num_mtp_layers": 0})
    limits = SchedulerConfig(max_num_batched_tokens=64, max_num_seqs=4, max_model_len=256)
    with pytest.raises(ValueError, match="include_mtp=True"):
        BlockManager(KvLayout.for_chunks(spec, 40, limits, CacheConfig()), CacheConfig(), mtp_rows=True)
