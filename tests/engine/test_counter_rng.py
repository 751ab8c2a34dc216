"""The counter-based generator: ``hash32`` is lowbias32 exactly (against the 32-bit integer arithmetic
written out in Python), and its uniforms are a pure function of (key, column), in (0, 1), uniform."""

import torch

from atom.model_executor.counter_rng import hash32, row_keys, uniforms


def lowbias32(x: int) -> int:
    x ^= x >> 16
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x846CA68B) & 0xFFFFFFFF
    return x ^ (x >> 16)


def test_hash32_is_lowbias32_on_the_whole_32_bit_range():
    xs = [0, 1, 2, 12345, 0x7FFFFFFF, 0x80000000, 0xDEADBEEF, 0xFFFFFFFF] + list(range(1000, 1100))
    assert hash32(torch.tensor(xs, dtype=torch.int64)).tolist() == [lowbias32(x) for x in xs]


def test_uniforms_depend_only_on_key_and_column_and_lie_strictly_between_0_and_1():
    keys = row_keys(torch.tensor([7, 7, 8]), torch.tensor([0, 0, 0]), torch.tensor([3, 3, 3]))
    u = uniforms(keys, 50_000)
    assert torch.equal(u[0], u[1]) and not torch.equal(u[0], u[2])
    assert torch.equal(uniforms(keys[2:], 10), u[2:, :10])  # the batch and the width change nothing
    assert 0.0 < float(u.min()) and float(u.max()) < 1.0
    assert abs(float(u.mean()) - 0.5) < 0.005 and abs(float(u.std()) - (1 / 12) ** 0.5) < 0.005
    other_position = row_keys(torch.tensor([7]), torch.tensor([0]), torch.tensor([4]))
    assert not torch.equal(uniforms(other_position, 10)[0], u[0, :10])
