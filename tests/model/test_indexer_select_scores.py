"""The batched top-k of the serving path (``Indexer.select_scores``: one ``torch.topk`` select, no sort)
picks what the reference's per-query ``Indexer.select`` picks over each query's visible entries."""

import torch

from atom.models.deepseek_v4.indexer import Indexer


def reference_picks(scores: torch.Tensor, visible: torch.Tensor, topk: int) -> list[list[int]]:
    rows = []
    for row, v in zip(scores, visible.tolist()):
        picks = Indexer.select(row[: min(v, row.shape[0])], topk).tolist()
        rows.append(picks + [-1] * (topk - len(picks)))
    return rows


def test_batched_top_k_equals_the_per_query_selection_with_ties_to_the_lower_index_and_minus_one_padding():
    gen = torch.Generator().manual_seed(4)
    for n, topk in ((1, 3), (7, 3), (16, 4), (33, 8), (40, 64), (0, 2)):
        scores = torch.randint(-3, 4, (12, n), generator=gen).float()  # few distinct values: many ties
        visible = torch.randint(0, n + 3, (12,), generator=gen)
        got = Indexer.select_scores(scores, visible, topk)
        assert got.dtype == torch.int32 and got.shape == (12, topk)
        assert got.tolist() == reference_picks(scores, visible, topk)


def test_batched_top_k_of_a_worked_example():
    scores = torch.tensor([[0.0, 2.0, 0.0, 1.0, 2.0, 0.0], [0.0, 2.0, 0.0, 1.0, 2.0, 0.0], [5.0, 1.0, 1.0, 1.0, 9.0, 9.0]])
    got = Indexer.select_scores(scores, torch.tensor([6, 3, 4]), 3)
    assert got.tolist() == [[1, 3, 4], [0, 1, 2], [0, 1, 2]]


def test_batched_top_k_runs_no_sort_and_the_same_ops_for_one_query_or_many():
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.names: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.names.append(func.__name__)
            return func(*args, **(kwargs or {}))

    with Ops() as ops:
        Indexer.select_scores(torch.randn(4, 64), torch.tensor([10, 64, 3, 0]), 8)
    with Ops() as one:
        Indexer.select_scores(torch.randn(1, 64), torch.tensor([10]), 8)
    assert one.names == ops.names  # a [1, n] slice is contiguous where a [4, n] one is not: no clone either way
    assert "topk.default" in ops.names
    assert not [name for name in ops.names if name.split(".")[0] in ("sort", "argsort", "msort")]
