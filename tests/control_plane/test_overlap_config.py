"""SchedulerConfig.overlap and --no-overlap: on by default, off by the flag, validated, off with drafts."""

import pytest

from atom.config import CacheConfig, Dsv4KvSpec, SchedulerConfig
from atom.entrypoints import cli
from atom.entrypoints.args import engine_config_from_args
from atom.kv.block_manager import BlockManager
from atom.kv.kv_layout import KvLayout
from atom.model_engine.llm_engine import LLMEngine
from atom.model_engine.scheduler import Scheduler
from atom.testing.fake_runner import FakeRunner
from support.control_plane import TINY


def test_serve_overlaps_steps_unless_no_overlap_is_given():
    parse = cli.build_parser().parse_args
    assert engine_config_from_args(parse(["serve"])).scheduler.overlap is True
    assert engine_config_from_args(parse(["serve", "--no-overlap"])).scheduler.overlap is False


@pytest.mark.parametrize("value", ["no", 0, 1, None])
def test_an_overlap_that_is_not_a_bool_is_rejected_naming_the_field(value):
    with pytest.raises(ValueError, match=r"overlap=.*accepted: True or False"):
        SchedulerConfig(overlap=value)


@pytest.mark.parametrize("overlap,drafts,engine_overlaps", [(True, 0, True), (False, 0, False), (True, 2, False)])
def test_the_engine_overlaps_only_when_asked_and_without_speculative_decoding(overlap, drafts, engine_overlaps):
    limits = SchedulerConfig(max_num_seqs=2, max_model_len=64, speculative_num_tokens=drafts, overlap=overlap)
    bm = BlockManager(KvLayout.for_chunks(Dsv4KvSpec(**TINY), 8, limits, CacheConfig()), CacheConfig())
    assert LLMEngine(Scheduler(limits, bm, eos_token_id=None), FakeRunner()).overlap is engine_overlaps
