"""step_memo: a memoized index helper runs once per distinct arguments inside the scope, again after an in-place
write to a tensor argument, always outside the scope; and the references that use it write the same rows
with the scope as without it."""

import torch

from atom.kernels.step_memo import memoized, step_memo
from atom.kernels.swa_write import swa_write_ref

calls = []


@memoized
def doubled(t: torch.Tensor, k: int) -> torch.Tensor:
    calls.append(k)
    return t * 2 + k


def test_inside_the_scope_equal_arguments_share_one_result_and_other_arguments_compute_their_own():
    calls.clear()
    t = torch.arange(4)
    with step_memo():
        first = doubled(t, 1)
        assert doubled(t, 1) is first
        assert torch.equal(doubled(t, 2), t * 2 + 2)
        assert doubled(t.clone(), 1) is not first  # another tensor of equal values is another key
    assert calls == [1, 2, 1]


def test_an_in_place_write_to_an_argument_makes_a_new_key():
    calls.clear()
    t = torch.arange(4)
    with step_memo():
        before = doubled(t, 0)
        t.add_(1)
        after = doubled(t, 0)
    assert calls == [0, 0] and torch.equal(before, torch.arange(4) * 2) and torch.equal(after, (torch.arange(4) + 1) * 2)


def test_outside_the_scope_and_for_inference_tensors_it_simply_runs():
    calls.clear()
    t = torch.arange(4)
    doubled(t, 3)
    doubled(t, 3)
    with torch.inference_mode():
        frozen = torch.arange(4)
    with step_memo():
        doubled(frozen, 4)
        doubled(frozen, 4)
    assert calls == [3, 3, 4, 4]


def test_a_scope_forgets_everything_when_it_ends():
    calls.clear()
    t = torch.arange(4)
    with step_memo():
        doubled(t, 5)
    with step_memo():
        doubled(t, 5)
    assert calls == [5, 5]


def test_layers_writing_through_one_memoized_row_index_write_what_they_write_without_it(gen):
    table = torch.tensor([[3, 0, -1], [1, 2, 4]], dtype=torch.int32)
    seq = torch.tensor([0, 1, 1, -1, 0, 0], dtype=torch.int32)
    pos = torch.tensor([9, 0, 17, 5, 2, 20], dtype=torch.int32)  # a padding token; sequence 0 at 20: no page
    rows = {0: 1, 1: 8, 2: 33, 4: 26}  # token -> page * 8 + pos % 8
    with step_memo():
        for layer in range(3):
            k = torch.randn(6, 5, generator=gen)
            plain, memo = torch.zeros(40, 5), torch.zeros(40, 5)
            swa_write_ref(k, plain, table, seq, pos, block_size=8, row_stride=8)
            with step_memo():  # a fresh inner scope: the first layer computes, the others hit
                swa_write_ref(k, memo, table, seq, pos, block_size=8, row_stride=8)
            want = torch.zeros(40, 5)
            for token, row in rows.items():
                want[row] = k[token]
            assert torch.equal(plain, want) and torch.equal(memo, want)
