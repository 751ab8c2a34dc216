"""A verify step whose requests carry fewer drafts than the runner verifies is still a bucketed step: the
missing draft slots are padding tokens (on the padding row, at the request's last position, completing no
entry) and only the real rows are sampled, so the step can replay the verify graph of its bucket."""

import torch

from atom.model_ops.decode_buffers import DecodeBuffers
from atom.model_ops.step_inputs import PageTables
from atom.sampling_params import SamplingParams
from atom.step_contract import ScheduledBatch, ScheduledSeq

GREEDY = SamplingParams(max_tokens=8, temperature=0.0)


def verify_seq(seq_id: int, start: int, tokens: tuple[int, ...], slot: int) -> ScheduledSeq:
    """A decoding request's verify work: its last token at ``start`` and ``len(tokens) - 1`` drafts."""
    return ScheduledSeq(seq_id, start, tokens, sample=True, state_slot=slot, state_reset=False, restore_page=-1,
                        params=GREEDY, num_draft=len(tokens) - 1)


def tables_for(seq_ids: list[int]) -> PageTables:
    tables = PageTables(4, 8)
    for sid in seq_ids:
        tables.row_of[sid] = tables._free_rows.pop()
    return tables


def test_a_verify_batch_with_fewer_drafts_than_k_is_bucketed_and_other_shapes_are_not():
    buffers = DecodeBuffers(4, (0, 4), 64, padding_row=4, drafts=2)
    full = verify_seq(1, 10, (5, 6, 7), 0)
    one, none = verify_seq(2, 20, (8, 9), 1), verify_seq(3, 30, (4,), 2)
    assert buffers.bucket_for(ScheduledBatch(0, (full, one, none), (), (), ())) == 4
    assert buffers.padded_drafts(ScheduledBatch(0, (full, one, none), (), (), ()))
    assert not buffers.padded_drafts(ScheduledBatch(0, (full,), (), (), ()))
    too_many = verify_seq(4, 5, (1, 2, 3, 4), 3)  # three drafts for a runner verifying two
    assert buffers.bucket_for(ScheduledBatch(0, (full, too_many), (), (), ())) is None
    prefill = ScheduledSeq(5, 0, (1, 2, 3), sample=True, state_slot=3, state_reset=False, restore_page=-1,
                           params=GREEDY)  # three tokens, no drafts: a prefill chunk
    assert buffers.bucket_for(ScheduledBatch(0, (prefill,), (), (), ())) is None


def test_missing_draft_slots_are_padding_tokens_on_the_padding_row_that_complete_no_entry():
    buffers = DecodeBuffers(4, (0, 4), 64, padding_row=4, drafts=2)
    # request 1 at positions 10..12 (two drafts), request 2 at 22..23 (one draft), request 3 at 30 (none)
    batch = ScheduledBatch(0, (verify_seq(1, 10, (5, 6, 7), 0), verify_seq(2, 22, (8, 9), 1),
                               verify_seq(3, 30, (4,), 2)), (), (), ())
    tables = tables_for([1, 2, 3])
    step = buffers.fill(batch, tables)
    assert step.token_ids.tolist() == [5, 6, 7, 8, 9, 0, 4, 0, 0, 0, 0, 0]
    assert step.positions.tolist() == [10, 11, 12, 22, 23, 23, 30, 30, 30, 0, 1, 2]
    assert step.token_slot.tolist() == [0, 0, 0, 1, 1, 4, 2, 4, 4, 4, 4, 4]  # padding slots on the padding row
    assert buffers.kept[:6].tolist() == [0, 1, 2, 3, 4, 6]  # the real rows, in batch order
    # ratio 4: position 11 completes entry 2 of request 0, 23 entry 5 of request 1; nothing at a padded 23 or 30
    assert step.entries[4].seq.tolist()[:3] == [0, 1, -1] and step.entries[4].ids.tolist()[:2] == [2, 5]
    assert step.lengths == [3, 3, 3, 3] and step.max_pos == 63  # the context bucket, capped at max_model_len
    assert step.committed.rows.tolist() == [0, 3, 6, 9]


def test_the_sampled_rows_of_a_padded_verify_step_are_the_real_rows_in_batch_order():
    from atom.model_executor.decode_graphs import DecodeSteps

    buffers = DecodeBuffers(4, (0, 4), 64, padding_row=4, drafts=2)
    batch = ScheduledBatch(0, (verify_seq(1, 10, (5, 6, 7), 0), verify_seq(2, 20, (8,), 1)), (), (), ())

    def forward(step):  # each row's logits: its token id and its position
        return torch.stack([step.token_ids.float(), step.positions.float()], dim=1), torch.zeros(len(step.token_ids))

    decoded = DecodeSteps(forward, buffers, capture=False).run(batch, tables_for([1, 2]))
    assert decoded.logits.tolist() == [[5.0, 10.0], [6.0, 11.0], [7.0, 12.0], [8.0, 20.0]]
    full = ScheduledBatch(1, (verify_seq(1, 13, (1, 2, 3), 0),), (), (), ())
    decoded = DecodeSteps(forward, buffers, capture=False).run(full, tables_for([1]))
    assert decoded.logits.tolist() == [[1.0, 13.0], [2.0, 14.0], [3.0, 15.0]]
