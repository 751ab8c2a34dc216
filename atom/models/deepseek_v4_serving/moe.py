"""The serving model's MoE sub-layer: the reference's parameters (:class:`MoEWeights`), its own dispatch.

Routing is the reference's (``Gate``: the same scores, the same top-k or hash picks). The routed experts
run as one grouped GEMM over the (token, expert) pairs sorted by expert (:meth:`MoEWeights.routed`: no
per-expert loop, no data-dependent size, nothing read back from the device) whenever every expert is held
here with dense weights; otherwise (quantized experts, whose GEMM ops take one weight each, or an
expert-parallel rank) one GEMM per expert present in the step, whose dispatch reads the routing back.
:attr:`ServingMoE.host_free` says which: the serving model declares CUDA-graph support from it.
"""

from __future__ import annotations

import torch

from atom.models.deepseek_v4.moe import MoEWeights

__all__ = ["ServingMoE"]


class ServingMoE(MoEWeights):
    """Routed experts plus the shared expert of one serving block (``[T, dim] -> [T, dim]``)."""

    @property
    def host_free(self) -> bool:
        """Whether :meth:`forward` runs without reading a device value back (the grouped path), so a
        CUDA graph can record it."""
        return self.grouped

    def forward(self, x: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
        """Each token adds its experts' outputs in ascending expert order, then the shared expert's."""
        weights, idx = self.gate(x, token_ids)
        routed = self.routed(x, weights, idx) if self.host_free else self.routed_per_expert(x, weights, idx)
        return self.with_shared(x, routed)
