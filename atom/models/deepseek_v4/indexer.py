"""Lightning indexer (CSA layers): picks the top-k compressed entries each query attends to.

Contract:

* ``project_q(qr, positions) -> [T, nI, cI]``: ``wq_b(qr)`` per head, RoPE on the last ``rope_head_dim`` dims at
  the query position; with ``quant_sim`` a Hadamard rotation and an FP4 round-trip.  (Without quantization the
  Hadamard rotation cancels between q and k and is omitted.)
* ``head_weights(x) -> [T, nI]``: ``weights_proj(x) * cI^-0.5 * nI^-0.5``.
* ``score(q_t, w_t, keys) -> [n]``: ``I[s] = sum_h w_h * relu(q_h . K_s)`` for one query over its ``n`` candidates.
* ``select(scores, topk) -> LongTensor``: ``k = min(topk, n)`` best candidates, ties broken by lower index, returned
  sorted ascending (canonical order, so attention sums rows in the same order every time).
* Keys come from the indexer's own compressor (c = cI, overlapping, ratio 4) stored in ``LayerCache.index_keys``;
  query ``t`` may pick among entries ``s < (t + 1) // 4``.
"""

from __future__ import annotations

import torch
from torch import nn

from atom.kernels.index_topk import topk_picks

from .compressor import Compressor
from .config import DeepseekV4Config
from .fused_ops import SmallOpsUser
from .layers import Linear
from .quant import fp4_roundtrip, hadamard_rotate
from .rope import apply_rope


class Indexer(SmallOpsUser, nn.Module):
    """The lightning indexer of one CSA layer; its queries' RoPE runs with its bound :attr:`small_ops`
    (:mod:`.fused_ops`)."""

    def __init__(self, cfg: DeepseekV4Config, freqs: torch.Tensor, *, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        self.cfg, self.freqs = cfg, freqs
        self.n_heads, self.head_dim = cfg.index_n_heads, cfg.index_head_dim
        self.wq_b = Linear(cfg.q_lora_rank, self.n_heads * self.head_dim, dtype=dtype, device=device)
        self.weights_proj = Linear(cfg.dim, self.n_heads, dtype=dtype, device=device)
        self.compressor = Compressor(cfg, 4, self.head_dim, freqs, for_indexer=True, dtype=dtype, device=device)
        self.weight_scale = self.head_dim**-0.5 * self.n_heads**-0.5

    def project_q(self, qr: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        return self.heads_q(self.wq_b(qr), positions)

    def heads_q(self, q: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The indexer queries ``[T, nI, cI]`` from ``wq_b``'s output ``[T, nI * cI]``."""
        q = apply_rope(q.unflatten(-1, (self.n_heads, self.head_dim)), positions, self.freqs, kernels=self.small_ops)
        if self.cfg.quant_sim:
            q = fp4_roundtrip(hadamard_rotate(q), self.cfg.fp4_block)
        return q

    def head_weights(self, x: torch.Tensor) -> torch.Tensor:
        return self.weights_proj(x) * self.weight_scale

    @staticmethod
    def score(q_t: torch.Tensor, w_t: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        return (torch.relu(q_t.float() @ keys.float().T) * w_t.float()[:, None]).sum(dim=0)

    @staticmethod
    def select(scores: torch.Tensor, topk: int) -> torch.Tensor:
        k = min(topk, scores.shape[0])
        order = torch.sort(scores, descending=True, stable=True).indices[:k]
        return torch.sort(order).values

    @staticmethod
    def select_all(q: torch.Tensor, w: torch.Tensor, keys: torch.Tensor, visible: torch.Tensor,
                   topk: int) -> torch.Tensor:
        """``select(score(...))`` for every query at once: int32 ``[T, topk]``, each row its picks ascending then
        -1 padding.  ``q [T, nI, cI]``, ``w [T, nI]``, ``keys [T, N, cI]`` (row ``t``: query ``t``'s candidate
        keys, entry order), ``visible [T]``: query ``t`` may pick entries ``< visible[t]`` (keys past that are
        ignored, whatever they hold)."""
        scores = (torch.relu(q.float() @ keys.float().transpose(1, 2)) * w.float()[:, :, None]).sum(dim=1)
        return Indexer.select_scores(scores, visible, topk)

    @staticmethod
    def select_scores(scores: torch.Tensor, visible: torch.Tensor, topk: int) -> torch.Tensor:
        """The picks of ``select_all`` from the scores ``[T, N]`` of every query's candidates (entry order).

        The picks of :meth:`select` per row, found by a select instead of two sorts (``topk_picks``, the torch
        reference of the ``index_topk`` kernel: the k-th largest visible score by ``torch.topk``, ties to the
        lower index, rows ascending and -1 padded, with the same ops whatever the number of queries)."""
        return topk_picks(scores, visible, topk)

    def select_chunk(self, q: torch.Tensor, w: torch.Tensor, positions: torch.Tensor,
                     keys: torch.Tensor) -> list[torch.Tensor]:
        """Each query's picks (ascending entry ids) given its projected ``q``/``w`` and the key cache, which must
        already hold the keys completed by this chunk."""
        picks = []
        for j, t in enumerate(positions.tolist()):
            n = (t + 1) // 4
            scores = self.score(q[j], w[j], keys[:n])
            picks.append(self.select(scores, self.cfg.index_topk))
        return picks
