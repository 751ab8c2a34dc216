"""The HCA online accumulator: the reference against a token loop and against batch softmax pooling,
chunking invariance (bit for bit), Triton against the reference, argument checks."""

import pytest
import torch
from support.kernels import assert_same_bits, i32, ragged

from atom.kernels.hca_state import hca_state_update, hca_state_update_ref

NAN = float("nan")
UPDATE = {"triton": hca_state_update, "torch": hca_state_update_ref}


def rows(n, width, gen, scale=3.0):
    return torch.randn(n, width, generator=gen) * scale


def nan_acc(slots, width):
    return torch.full((slots, 3, width), NAN)


def loop_update(kv, score, ape, acc, slots, lens, starts, pooled):
    """The contract, one token at a time."""
    ratio, t = ape.shape[0], 0
    for s, (n, p0) in enumerate(zip(lens, starts)):
        for j in range(n):
            pos, slot = p0 + j, int(slots[s])
            if slot >= 0:
                if pos % ratio == 0:
                    acc[slot, 0], acc[slot, 1], acc[slot, 2] = float("-inf"), 0.0, 0.0
                m, l, a = acc[slot, 0].clone(), acc[slot, 1].clone(), acc[slot, 2].clone()
                sc = score[t] + ape[pos % ratio]
                m_new = torch.maximum(m, sc)
                c, p = torch.exp(m - m_new), torch.exp(sc - m_new)
                l, a = l * c + p, a * c + p * kv[t]
                acc[slot, 0], acc[slot, 1], acc[slot, 2] = m_new, l, a
                if (pos + 1) % ratio == 0:
                    pooled[t] = a / l
            t += 1


def test_reference_equals_a_token_loop_and_starts_each_block_empty(gen):
    lens, starts = [37, 3, 0, 9, 16], [5, 13, 4, 32, 48]  # seq 0 crosses three block ends in one chunk
    cu, pos_start = ragged(lens, starts)
    n, width, ratio = sum(lens), 6, 16
    kv, score, ape = rows(n, width, gen), rows(n, width, gen), rows(ratio, width, gen)
    slots = i32([2, 0, 3, -1, 1])
    acc = nan_acc(4, width)
    acc[2], acc[0] = rows(3, width, gen), rows(3, width, gen)  # the slots of chunks that start mid-block
    acc[2, 1].abs_(), acc[0, 1].abs_()
    want_acc, got_pooled, want_pooled = acc.clone(), torch.full((n, width), NAN), torch.full((n, width), NAN)
    hca_state_update_ref(kv, score, ape, acc, slots, cu, pos_start, got_pooled)
    loop_update(kv, score, ape, want_acc, slots, lens, starts, want_pooled)
    assert_same_bits(acc, want_acc)
    assert_same_bits(got_pooled, want_pooled)
    written = ~torch.isnan(got_pooled[:, 0])
    assert written.nonzero().squeeze(1).tolist() == [10, 26, 39, 64]  # positions 15, 31 | 15 | - | 63


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_any_split_into_steps_gives_bit_identical_entries_and_state(backend, gen):
    ratio, width, total = 16, 12, 53
    kv, score, ape = rows(total, width, gen), rows(total, width, gen), rows(ratio, width, gen)

    def run(splits):
        acc, pooled, pos = nan_acc(2, width), torch.full((total, width), NAN), 0
        for n in splits:
            cu, pos_start = ragged([n], [pos])
            out = torch.full((n, width), NAN)
            UPDATE[backend](kv[pos:pos + n], score[pos:pos + n], ape, acc, i32([1]), cu, pos_start, out)
            pooled[pos:pos + n] = out
            pos += n
        return acc[1], pooled

    whole = run([total])
    for splits in ([1] * total, [5, 11, 16, 21], [16, 16, 16, 5], [40, 13]):
        got = run(splits)
        assert_same_bits(got[0], whole[0])
        assert_same_bits(got[1], whole[1])


def test_pooled_rows_match_a_batch_softmax_within_1e_6_relative(gen):
    ratio, width, blocks = 128, 64, 6
    n = ratio * blocks
    kv, score, ape = rows(n, width, gen), rows(n, width, gen, scale=6.0), rows(ratio, width, gen)
    cu, pos_start = ragged([n], [0])
    pooled = torch.full((n, width), NAN)
    hca_state_update_ref(kv, score, ape, nan_acc(1, width), i32([0]), cu, pos_start, pooled)
    got = pooled[ratio - 1::ratio]
    s = (score + ape.repeat(blocks, 1)).view(blocks, ratio, width)
    want = (kv.view(blocks, ratio, width) * s.softmax(dim=1)).sum(dim=1)
    rel = ((got - want).abs() / want.abs().amax(dim=1, keepdim=True)).max()
    assert float(rel) < 1e-6


def test_triton_equals_the_reference_within_rounding_of_exp(gen):
    lens, starts = [37, 1, 5, 0, 20], [3, 15, 0, 9, 16]
    cu, pos_start = ragged(lens, starts)
    n, width, ratio = sum(lens), 24, 16
    kv, score, ape = rows(n, width, gen), rows(n, width, gen), rows(ratio, width, gen)
    slots = i32([4, 1, -1, 0, 2])
    acc = nan_acc(5, width)
    acc[4], acc[1] = rows(3, width, gen), rows(3, width, gen)
    acc[4, 1].abs_(), acc[1, 1].abs_()
    got_acc, got = acc.clone(), torch.full((n, width), NAN)
    ref_acc, ref = acc.clone(), torch.full((n, width), NAN)
    hca_state_update(kv, score, ape, got_acc, slots, cu, pos_start, got)
    hca_state_update_ref(kv, score, ape, ref_acc, slots, cu, pos_start, ref)
    assert torch.equal(torch.isnan(got), torch.isnan(ref))
    torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-6, equal_nan=True)
    torch.testing.assert_close(got_acc, ref_acc, rtol=1e-6, atol=1e-6, equal_nan=True)


def _args(width=4, slots=2, acc_rows=3, slot_values=(0,)):
    cu, pos_start = ragged([3] * len(slot_values), [0] * len(slot_values))
    n = 3 * len(slot_values)
    return (torch.zeros(n, width), torch.zeros(n, width), torch.zeros(16, width), torch.zeros(slots, acc_rows, width),
            i32(list(slot_values)), cu, pos_start, torch.zeros(n, width))


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("case,needle", [
    (dict(acc_rows=4), "max, sum, weighted sum"),
    (dict(slot_values=(2,)), "state_slot"),
])
def test_update_wrapper_rejects_bad_arguments(backend, case, needle):
    with pytest.raises(ValueError, match=needle):
        UPDATE[backend](*_args(**case))
