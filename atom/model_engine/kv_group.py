"""The one mapping from a layer's compress ratio to its layout group.

Kept in its own module so that config, layout, arena and model code all ask the same function
(ATOM re-implemented this mapping inline in the model and the two drifted).
"""

from __future__ import annotations

from atom.validation import require_int
__all__ = ["CSA_RATIO", "group_of_ratio", "is_csa", "is_hca"]

CSA_RATIO = 4


def group_of_ratio(ratio: int) -> str:
    """``0 -> "dense"`` (SWA only), ``4 -> "c4"`` (CSA), ``r -> f"c{r}"`` (HCA, e.g. ``c128``)."""
    require_int("compress ratio", ratio, 0)
    return "dense" if ratio == 0 else f"c{ratio}"


def is_csa(ratio: int) -> bool:
    return group_of_ratio(ratio) == "c4"


def is_hca(ratio: int) -> bool:
    return group_of_ratio(ratio) not in ("dense", "c4")
