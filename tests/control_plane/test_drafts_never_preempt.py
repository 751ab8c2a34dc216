"""Speculative drafts take only memory the arena has spare: they never preempt another request, evict
a cached block or release a retention pin; when the arena is short a request drafts fewer tokens."""

from atom.config import CacheConfig, Dsv4KvSpec, SchedulerConfig
from atom.kv.block_manager import BlockManager
from atom.testing.replay_draft import ReplayDraft
from atom.kv.kv_layout import KvLayout
from atom.model_engine.scheduler import Scheduler
from atom.model_engine.sequence import Sequence, SequenceStatus
from atom.sampling_params import SamplingParams
from atom.testing.fake_runner import FakeRunner
from atom.testing.kv_content_model import KvContentModel

from support.control_plane import TINY

# two requests (prompts of 5 and 12 tokens, 40 output tokens each) in a 6-chunk arena, model length 64:
# without speculation they decode side by side, one token per step, and never preempt
PROMPTS = [[(7 * i + salt) % 997 + 1 for i in range(n)] for salt, n in ((1, 5), (2, 12))]
N_OUT = 40


def run(k: int, num_chunks: int = 6, outputs=None, shift: int = 1):
    """(steps, preemptions, outputs by prompt, scheduler) of the two requests; with ``k`` > 0 the
    drafts replay ``outputs`` plus ``shift`` (1: always wrong, 0: always right)."""
    spec = Dsv4KvSpec(**TINY)
    limits = SchedulerConfig(max_num_batched_tokens=32, max_num_seqs=4, max_model_len=64, speculative_num_tokens=k)
    cache = CacheConfig(chunk_pages=1)
    bm = BlockManager(KvLayout.for_chunks(spec, num_chunks, limits, cache), cache)
    drafter = ReplayDraft(outputs, shift=shift, vocab_size=997) if k else None
    sched = Scheduler(limits, bm, None, drafter=drafter)
    runner = FakeRunner(vocab_size=997, content=KvContentModel.for_spec(spec, lambda sid: sched.by_id[sid].token_ids))
    seqs = [Sequence(list(p), SamplingParams(max_tokens=N_OUT, ignore_eos=True), spec.block_size, seq_id=i)
            for i, p in enumerate(PROMPTS)]  # the fake runner's tokens depend on the id
    for seq in seqs:
        sched.add(seq)
    steps = 0
    while sched.has_unfinished():
        batch = sched.schedule()
        sched.postprocess(batch, runner.execute(batch))
        sched.check_integrity()
        steps += 1
    assert all(s.status is SequenceStatus.FINISHED_LENGTH for s in seqs)
    return steps, sched.num_preemptions, {tuple(p): s.output_token_ids for p, s in zip(PROMPTS, seqs)}, sched


def test_always_wrong_drafts_in_a_full_arena_take_no_more_steps_and_preempt_nobody():
    # both prompts prefill in step 1 (which samples each request's first token), then 39 decode steps:
    # 40 steps. Always-wrong drafts yield one token per step too, so the same 40 steps, and with no
    # preemption (they used to grow each request by 1 + 3 tokens at once: 2 preemptions, 54 steps)
    steps_off, preempted_off, outputs, _ = run(0)
    assert (steps_off, preempted_off) == (40, 0)
    steps, preempted, spec_outputs, sched = run(3, outputs=outputs)
    assert (steps, preempted) == (40, 0)
    assert spec_outputs == outputs
    # each request proposes min(3, tokens left - 1) drafts on its 39 decode steps: 111, 222 for both when
    # every draft fits (the roomy arena); in the full one 14 are cut at block ends where no page is spare
    assert (sched.spec.proposed, sched.spec.accepted) == (208, 0)
    assert run(3, num_chunks=12, outputs=outputs)[3].spec.proposed == 222


def test_right_drafts_in_a_full_arena_still_speed_decoding_up_without_preempting():
    _, _, outputs, _ = run(0)
    steps, preempted, spec_outputs, sched = run(3, outputs=outputs, shift=0)
    assert spec_outputs == outputs and preempted == 0
    assert sched.spec.accepted == sched.spec.proposed > 0 and steps < 40


def test_growth_for_drafts_takes_free_pages_only_and_evicts_nothing(harness):
    # a finished request leaves cached blocks and pins; a running one then grows block by block with
    # spare_only until the free pages run out: that growth is refused and no cached block or pin moves,
    # while the same growth without spare_only evicts to make its room
    from atom.kv.chunk_arena import ArenaEmpty

    h = harness(num_chunks=12, full_retain=True, interval=32, budget=32, max_model_len=512)
    h.add([(7 * i + 3) % 997 + 1 for i in range(100)], max_tokens=2)
    h.run()
    seq = h.add([(11 * i + 5) % 997 + 1 for i in range(300)], max_tokens=2)
    h.step()
    bm = h.bm

    def cache_state():
        return (list(bm.swa.pool._cached), list(bm.comp.pool._cached), bm.swa.pinned_ids(),
                bm.swa.pool.num_evictions + bm.comp.pool.num_evictions)
    before = cache_state()
    assert bm.swa.num_pins > 0 and bm.swa.pool.num_cached() > 0 and bm.comp.pool.num_cached() > 0
    n = 32
    while True:  # the whole run of tokens the free pages back
        try:
            bm.grow(seq, n + 16, spare_only=True)
        except ArenaEmpty as refused:
            assert "no spare room" in str(refused)
            break
        n += 16
    assert cache_state() == before
    bm.grow(seq, n + 16)
    assert cache_state()[3] > before[3]
