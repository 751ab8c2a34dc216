"""The MTP layer's row at a block's last position is computed from the token after the block, which
the block's key does not cover: a prefix hit never serves it to a request whose next token differs
(the hit stops one boundary earlier), so its drafts equal a cold run's exactly."""

import torch

from atom.sampling_params import SamplingParams

GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
SHARED = [(53 * i + 7) % 500 + 1 for i in range(32)]  # two blocks of 16
FIRST = SHARED + [(31 * i + 3) % 500 + 1 for i in range(12)]
# differs from FIRST right at the boundary, and ends within the MTP layer's window (8) of it: its first
# draft's attention reads the MTP row at position 31
SECOND = SHARED + [(17 * i + 5) % 500 + 1 for i in range(4)]


def spy_mtp_logits(engine) -> list[torch.Tensor]:
    """Record the MTP layer's logits (the first draft's) of every step that drafts."""
    seen: list[torch.Tensor] = []
    mtp = engine.runner.mtp
    forward = mtp._forward

    def recording(*args, **kwargs):
        x, logits = forward(*args, **kwargs)
        if logits.shape[0]:
            seen.append(logits.clone())
        return x, logits
    mtp._forward = recording
    return seen


def run(engine, prompt):
    """Run ``prompt`` alone to the end; (its sequence, the drafts the runner proposed after each step)."""
    seq = engine.sequence(engine.add_request(prompt, GREEDY))
    drafts = []
    while engine.has_unfinished_requests():
        out = engine.step_detailed().output
        drafts.append(out.drafts.get(seq.seq_id, ()))
        engine.check_integrity()
    return seq, [d for d in drafts if d]


def test_a_hit_whose_next_token_differs_drafts_exactly_as_a_cold_run(make_engine):
    assert FIRST[32] != SECOND[32]
    # 16-token chunks everywhere, so the cold run's prefill is split at the hit boundary too
    cold_engine = make_engine(budget=16, full_retain=True, speculative=1)
    cold_logits = spy_mtp_logits(cold_engine)
    cold, cold_drafts = run(cold_engine, SECOND)
    engine = make_engine(budget=16, full_retain=True, speculative=1)
    run(engine, FIRST)  # publishes blocks 0 and 1; block 1's last MTP row was computed with FIRST[32]
    hit_logits = spy_mtp_logits(engine)
    hit, hit_drafts = run(engine, SECOND)
    # the hit stops at block 0, whose next token (SHARED[16]) is the same; it used to take both blocks
    # and read block 1's MTP row, computed for FIRST's next token
    assert hit.num_cached_tokens == 16 and hit.stats.reused == 16
    assert hit.output_token_ids == cold.output_token_ids
    assert len(hit_logits) == len(cold_logits) == 6  # one drafting step per output token
    for a, b in zip(hit_logits, cold_logits):
        assert torch.equal(a, b)
    assert hit_drafts == cold_drafts


def test_a_hit_whose_next_token_matches_still_takes_every_block(make_engine):
    engine = make_engine(budget=16, full_retain=True, speculative=1)
    run(engine, FIRST)
    again, _ = run(engine, FIRST[:33] + [7, 7, 7])  # same token after block 1
    assert again.num_cached_tokens == 32
