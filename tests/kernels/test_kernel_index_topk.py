"""index_topk: the torch reference is ``Indexer.select_scores`` pick for pick, and the Triton kernel (interpreter)
picks the same entries at random widths, with ties, signed zeros, hidden entries and fewer visible than k."""

import pytest
import torch

from atom.kernels.index_topk import index_topk, index_topk_ref
from atom.models.deepseek_v4.indexer import Indexer


def _case(gen: torch.Generator, tokens: int, width: int, levels: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    if levels is None:
        scores = torch.randn(tokens, width, generator=gen)
    else:  # few distinct values: many ties at the threshold, both zeros among them
        values = torch.tensor([-1.5, -0.0, 0.0, 0.25, 2.0, float("-inf")])[:levels]
        scores = values[torch.randint(0, levels, (tokens, width), generator=gen)]
    visible = torch.randint(0, width + 3, (tokens,), generator=gen)
    visible[0] = width  # every entry visible
    return scores, visible


@pytest.mark.parametrize("tokens, width, topk, levels", [(1, 10, 4, None), (5, 37, 8, None), (3, 40, 512, None),
                                                         (6, 50, 7, 3), (4, 64, 9, 6), (2, 1500, 33, None),
                                                         (3, 1300, 100, 5)])
def test_the_kernel_picks_what_the_reference_indexer_picks(tokens, width, topk, levels, gen):
    scores, visible = _case(gen, tokens, width, levels)
    expected = Indexer.select_scores(scores, visible, topk)
    assert torch.equal(index_topk_ref(scores, visible, topk), expected)
    assert torch.equal(index_topk(scores, visible, topk), expected)


def test_a_query_that_sees_nothing_gets_only_padding():
    scores = torch.randn(2, 12)
    picks = index_topk(scores, torch.tensor([0, -1]), 5)
    assert picks.tolist() == [[-1] * 5, [-1] * 5]


def test_bad_arguments_are_refused_with_what_is_accepted():
    with pytest.raises(ValueError, match="scores must be fp32"):
        index_topk(torch.zeros(2, 3, dtype=torch.float64), torch.zeros(2, dtype=torch.int64), 2)
    with pytest.raises(ValueError, match="topk must be >= 1"):
        index_topk(torch.zeros(2, 3), torch.zeros(2, dtype=torch.int64), 0)
