"""Which slice of every DeepSeek-V4 tensor one rank holds.

A :class:`ShardPlan` is a pure function of (rank, size, mode) and a tensor name; the sharding pass
and the loader both ask it, so the shapes a rank allocates and the slices it reads cannot disagree.

========================================  =========================================================
tensor (``layers.N.`` / ``mtp.N.``)       rank ``k`` of ``n`` holds
========================================  =========================================================
``embed.weight``, ``head.weight``         rows ``k/n`` of the vocabulary (vocab-parallel)
``attn.wq_b.weight``, ``attn.attn_sink``  its ``n_heads / n`` query heads            (split attention)
``attn.wo_a.weight``                      its ``o_groups / n`` output groups (rows)  (split attention)
``attn.wo_b.weight``                      the matching input columns (row-parallel)  (split attention)
``ffn.experts.E.*``                       tensor parallel: ``w1``/``w3`` rows (output columns of the
                                          GEMM) and ``w2`` columns, slice ``k/n``; expert parallel:
                                          experts ``k*E/n .. (k+1)*E/n - 1`` whole, no others
``ffn.shared_experts.*``                  ``w1``/``w3`` rows and ``w2`` columns, slice ``k/n``
everything else                           the whole tensor (norms, mHC, router, latent KV
                                          projection, compressors, lightning indexer)
========================================  =========================================================

A quantized weight's ``.scale`` has the weight's split: the plan names the logical ``[out, in]``
dimension, and the loader reads the scale blocks (FP8: 128x128; MXFP4: 32 inputs) covering the slice.

With ``replicas = D > 1`` (data-parallel attention) the group is ``D`` attention replicas of ``T = n/D``
ranks: the vocabulary, the attention and the shared expert are split over the ``T`` ranks of a replica
only (rank ``k`` holds part ``k mod T`` of ``T``; whole when ``T = 1``), while the routed experts are still
split or partitioned over all ``n`` ranks (:mod:`atom.parallel.expert_exchange` moves the rows).

The latent KV is one head (MQA), so every rank computes and stores all of it: the KV arena is
replicated across a replica's ranks, not split. Query heads ``k*H/n ..`` feed output groups ``k*G/n ..`` because a group
owns ``H/G`` consecutive heads; that is why ``o_groups`` must be a multiple of ``n``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from atom.models.deepseek_v4.config import DeepseekV4Config

__all__ = ["Split", "ShardPlan", "DROPPED"]

_LAYER = r"^(?:layers|mtp)\.\d+\."
_VOCAB = re.compile(r"^(?:embed|head)\.weight$")
_W = r"\.(?:weight|scale)$"  # a quantized weight's block scales are split with it
_ATTN_ROWS = re.compile(_LAYER + r"attn\.(?:(?:wq_b|wo_a)\.(?:weight|scale)|attn_sink)$")
_ATTN_COLS = re.compile(_LAYER + r"attn\.wo_b" + _W)
_EXPERT = re.compile(_LAYER + r"ffn\.experts\.(\d+)\.(w[123])" + _W)
_SHARED = re.compile(_LAYER + r"ffn\.shared_experts\.(w[123])" + _W)


@dataclass(frozen=True)
class Split:
    """Part ``index`` of ``parts`` equal parts of a tensor along ``dim``."""

    dim: int
    index: int
    parts: int

    def bounds(self, length: int) -> tuple[int, int]:
        """``(start, stop)`` of this part in a dimension of ``length`` (which ``parts`` divides)."""
        assert length % self.parts == 0, (length, self.parts)
        step = length // self.parts
        return self.index * step, (self.index + 1) * step


#: The plan's answer for a tensor this rank does not hold at all (another rank's expert).
DROPPED = "dropped"


@dataclass(frozen=True)
class ShardPlan:
    """Rank ``rank`` of ``size``.

    ``split_attention``: query heads and output groups are split (tensor-parallel attention); when
    False every rank runs the whole attention (replicated; the basis of data-parallel attention).
    ``expert_parallel``: the model's ``n_experts`` routed experts are partitioned whole across the
    ranks instead of each being split. ``replicas``: attention replicas (data parallel) the ``size``
    ranks form; the dense tensors are split over a replica's :attr:`dense_size` ranks only.
    """

    rank: int = 0
    size: int = 1
    split_attention: bool = True
    expert_parallel: bool = False
    n_experts: int = 0
    replicas: int = 1

    def __post_init__(self) -> None:
        if isinstance(self.size, bool) or not isinstance(self.size, int) or self.size < 1:
            raise ValueError(f"parallel size={self.size!r} must be an integer >= 1")
        if isinstance(self.rank, bool) or not isinstance(self.rank, int) or not 0 <= self.rank < self.size:
            raise ValueError(f"rank={self.rank!r} must be in 0..{self.size - 1}")
        if self.expert_parallel and self.n_experts < 1:
            raise ValueError("expert parallelism needs the model's number of routed experts (n_experts)")
        if isinstance(self.replicas, bool) or not isinstance(self.replicas, int) or self.replicas < 1 \
                or self.size % self.replicas:
            raise ValueError(f"replicas={self.replicas!r} must be an integer >= 1 dividing the parallel size {self.size}")

    @property
    def dense_size(self) -> int:
        """Ranks of one attention replica: those that split the vocabulary, attention and shared expert."""
        return self.size // self.replicas

    @property
    def dense_rank(self) -> int:
        """This rank's place in its replica."""
        return self.rank % self.dense_size

    @property
    def sharded(self) -> bool:
        return self.size > 1

    def _part(self, dim: int) -> Split:
        return Split(dim, self.rank, self.size)

    def _dense_part(self, dim: int) -> Split | None:
        return None if self.dense_size == 1 else Split(dim, self.dense_rank, self.dense_size)

    def spec(self, name: str) -> Split | str | None:
        """How this rank holds tensor ``name``: a :class:`Split`, ``None`` (whole) or :data:`DROPPED`."""
        if self.size == 1:
            return None
        kind = self._kind(name)
        if kind == "expert":
            expert, which = _EXPERT.match(name).groups()
            if self.expert_parallel:
                return None if int(expert) in self.expert_range() else DROPPED
            return self._part(1 if which == "w2" else 0)
        if kind == "shared":
            return self._dense_part(1 if _SHARED.match(name).group(1) == "w2" else 0)
        return None if kind is None else self._dense_part(1 if kind == "cols" else 0)

    def is_sharded(self, name: str) -> bool:
        """Whether tensor ``name`` is split or partitioned across the ranks in this mode (at any size; with
        replicas of one rank, only the routed experts)."""
        kind = self._kind(name)
        if kind is not None and kind != "expert" and self.replicas > 1 and self.dense_size == 1:
            return False
        return kind is not None

    def _kind(self, name: str) -> str | None:
        if _VOCAB.match(name):
            return "rows"
        if self.split_attention and _ATTN_ROWS.match(name):
            return "rows"
        if self.split_attention and _ATTN_COLS.match(name):
            return "cols"
        if _EXPERT.match(name):
            return "expert"
        if _SHARED.match(name):
            return "shared"
        return None

    def expert_range(self) -> range:
        """The routed experts this rank computes (expert parallel: its partition; else all of them)."""
        if not self.expert_parallel:
            return range(self.n_experts)
        start, stop = self._part(0).bounds(self.n_experts)
        return range(start, stop)

    def check(self, cfg: "DeepseekV4Config") -> None:
        """``ValueError`` naming the model dimension that this plan cannot split evenly."""
        if self.size == 1:
            return
        for field, value, parts in self._split_dims(cfg):
            if value % parts:
                what = "parallel size" if parts == self.size else "tensor-parallel size of a replica"
                raise ValueError(f"the model's {field}={value} is not a multiple of the {what} {parts}; "
                                 f"sizes that split this model evenly: {self.valid_sizes(cfg)}")
        if self.expert_parallel and self.n_experts != cfg.n_routed_experts:
            raise ValueError(f"plan for {self.n_experts} experts but the model has {cfg.n_routed_experts}")

    def _split_dims(self, cfg: "DeepseekV4Config", size: int | None = None) -> list[tuple[str, int, int]]:
        """``(model field, its value, parts it is split into)`` for every dimension this mode splits."""
        n = self.size if size is None else size
        t = n // self.replicas
        dims = [("vocab_size", cfg.vocab_size, t), ("moe_inter_dim", cfg.moe_inter_dim, t)]  # shared expert
        if not self.expert_parallel:
            dims.append(("moe_inter_dim", cfg.moe_inter_dim, n))  # each routed expert split over all ranks
        if self.split_attention:
            dims += [("n_heads", cfg.n_heads, t), ("o_groups", cfg.o_groups, t)]
        if self.expert_parallel:
            dims.append(("n_routed_experts", cfg.n_routed_experts, n))
        return dims

    def valid_sizes(self, cfg: "DeepseekV4Config", up_to: int = 64) -> list[int]:
        """Every size up to ``up_to`` (a multiple of ``replicas``) that divides all the dimensions this mode splits."""
        return [n for n in range(self.replicas, up_to + 1, self.replicas)
                if all(v % parts == 0 for _, v, parts in self._split_dims(cfg, n))]
