"""The torch references' sync-free masked write (``masked_put`` / ``masked_puts``) and the shape checks."""

from __future__ import annotations

import pytest
import torch

from atom.kernels._common import check_index, check_rows, check_same_device, masked_put, masked_puts


def test_kept_entries_are_written_and_skipped_ones_leave_their_rows_alone():
    dst = torch.arange(12, dtype=torch.float32).reshape(6, 2)
    index = torch.tensor([4, -1, 1, 4])  # -1 and the duplicate 4 are skipped entries
    values = torch.tensor([[10.0, 11.0], [20.0, 21.0], [30.0, 31.0], [40.0, 41.0]])
    keep = torch.tensor([False, False, True, True])
    masked_put(dst, (index,), values, keep)
    assert dst.tolist() == [[0.0, 1.0], [30.0, 31.0], [4.0, 5.0], [6.0, 7.0], [40.0, 41.0], [10.0, 11.0]]


def test_nothing_kept_leaves_the_destination_unchanged_even_with_invalid_indices():
    dst = torch.arange(8, dtype=torch.float32).reshape(2, 2, 2)
    index = (torch.tensor([-1, 7]), torch.tensor([5, -3]))
    masked_put(dst, index, torch.full((2, 2), 99.0), torch.tensor([False, False]))
    assert dst.flatten().tolist() == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]


def test_masked_puts_writes_every_destination_at_the_shared_index():
    kv = torch.zeros(2, 3, 2)
    score = torch.zeros(2, 3)
    index = (torch.tensor([1, 0, 1]), torch.tensor([2, 0, 0]))
    keep = torch.tensor([True, False, True])
    masked_puts(((kv, torch.tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])), (score, torch.tensor([7.0, 8.0, 9.0]))),
                index, keep)
    assert kv.tolist() == [[[0.0, 0.0], [0.0, 0.0], [0.0, 0.0]], [[5.0, 6.0], [0.0, 0.0], [1.0, 2.0]]]
    assert score.tolist() == [[0.0, 0.0, 0.0], [9.0, 0.0, 7.0]]


def test_an_empty_batch_writes_nothing():
    dst = torch.ones(3, 2)
    masked_put(dst, (torch.zeros(0, dtype=torch.long),), torch.zeros(0, 2), torch.zeros(0, dtype=torch.bool))
    assert dst.tolist() == [[1.0, 1.0]] * 3


@pytest.mark.parametrize("t, kwargs, message", [
    ([1.0], {}, "x must be a torch.Tensor, got list"),
    (torch.zeros(2, 3, 4), {}, r"x must have 2 dims, got shape \(2, 3, 4\)"),
    (torch.zeros(2, 3, dtype=torch.int64), {}, "x has dtype torch.int64; expected one of"),
    (torch.zeros(2, 3), {"dtype": torch.bfloat16}, "expected one of torch.bfloat16$"),
    (torch.zeros(3, 2).t(), {}, r"contiguous inner dim \(stride\(-1\) == 1\), got strides \(1, 2\)"),
    (torch.zeros(2, 3), {"width": 4}, "x has inner width 3, expected 4"),
    (torch.zeros(2, 3), {"dtypes": iter([torch.float16])}, "expected one of torch.float16$"),
])
def test_check_rows_names_what_is_wrong(t, kwargs, message):
    with pytest.raises(ValueError, match=message):
        check_rows("x", t, **kwargs)


def test_check_rows_accepts_a_row_view_with_outer_strides():
    check_rows("x", torch.zeros(4, 8)[::2, :3], width=3)


@pytest.mark.parametrize("t, shape, message", [
    (torch.zeros(3, dtype=torch.int64), (3,), "i must be int32, got torch.int64"),
    (torch.zeros(3, dtype=torch.int32), (4,), r"i has shape \(3,\), expected \(4,\)"),
    (torch.zeros(3, dtype=torch.int32), (None, 1), r"i has shape \(3,\), expected \('\*', 1\)"),
    (torch.zeros(4, 2, dtype=torch.int32)[::2], (None, 2), r"i must be contiguous, got strides \(4, 1\)"),
])
def test_check_index_names_what_is_wrong(t, shape, message):
    with pytest.raises(ValueError, match=message):
        check_index("i", t, shape)


def test_check_same_device_names_every_device_when_they_differ():
    check_same_device(a=torch.zeros(1), b=torch.zeros(1))
    with pytest.raises(ValueError, match=r"all tensors must be on one device, got \{'a': device\(type='cpu'\), "
                                         r"'b': device\(type='meta'\)\}"):
        check_same_device(a=torch.zeros(1), b=torch.zeros(1, device="meta"))
