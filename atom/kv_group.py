"""The one mapping from a layer's compress ratio to its KV group, and the CSA facts that follow.

Config, layout, arena, scheduler and model code all ask this module, so the mapping cannot drift
between two copies. It is a top-level module, importing only ``atom.validation``, so that the config, the control plane and the model can all depend on it without depending
on each other.

Group names: ``dense`` (ratio 0, sliding window only), ``c4`` (CSA: an overlapping compressor plus
the lightning indexer), ``c{r}`` for any other ratio (HCA, ``c128`` in the released models).
"""

from __future__ import annotations

from atom.validation import require_int

__all__ = ["CSA_RATIO", "CSA_OVERLAP_ROWS", "CSA_STATE_RING", "HCA_STATE_ROWS", "group_of_ratio", "is_csa", "is_hca",
           "state_ring_rows"]

#: The compress ratio that makes a layer CSA.
CSA_RATIO = 4
#: Rows of the previous window a CSA compressor pools into the next entry (its overlap); they are
#: also the CSA boundary state a prefix hit restores (positions B-4..B-1 of a block).
CSA_OVERLAP_ROWS = CSA_RATIO
#: Rows of a live CSA compressor's kv/score ring (previous and current window; slot = pos % 8).
CSA_STATE_RING = 2 * CSA_RATIO
#: Rows of the engine's live HCA state: an online softmax accumulator (running max, running sum of
#: exp, running weighted sum), whatever the ratio.
HCA_STATE_ROWS = 3


def group_of_ratio(ratio: int) -> str:
    """``0 -> "dense"`` (SWA only), ``4 -> "c4"`` (CSA), ``r -> f"c{r}"`` (HCA, e.g. ``c128``)."""
    require_int("compress ratio", ratio, 0)
    return "dense" if ratio == 0 else f"c{ratio}"


def is_csa(ratio: int) -> bool:
    return group_of_ratio(ratio) == "c4"


def is_hca(ratio: int) -> bool:
    return group_of_ratio(ratio) not in ("dense", "c4")


def state_ring_rows(ratio: int) -> int:
    """Rows of the reference compressor's kv/score ring: CSA 8 (two windows), HCA ``ratio``, dense 0."""
    return CSA_STATE_RING if is_csa(ratio) else ratio
