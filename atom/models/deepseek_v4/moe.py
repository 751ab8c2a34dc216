"""Mixture of experts: sqrt-softplus router with aux-free bias (or hash routing), SwiGLU experts, shared expert.

* Router scores ``s = sqrt(softplus(x W^T))`` in fp32 (``softmax``/``sigmoid`` also accepted).
* Selection: top-k of ``s + bias`` (ties -> lower expert id), or ``tid2eid[token_id]`` on the first
  ``n_hash_layers`` layers.  Weights are the *unbiased* scores of the chosen experts, renormalised (except for
  softmax scoring), times ``route_scale``.
* Expert: ``w2(silu(min(w1 x, L)) * clamp(w3 x, -L, L))`` with ``L = swiglu_limit``; the routing weight multiplies
  the activation before ``w2``.  The shared expert always runs and is added last.

``MoEWeights`` holds the parameters and both routed paths (shared with the serving model's MoE); ``MoE`` is
the reference's forward.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from atom.comm import SINGLE_RANK, Comm

from .config import DeepseekV4Config
from .layers import Linear
from .module_copy import ModuleTemplate


class Gate(nn.Module):
    """Router of one layer: ``weight [E, dim]``; ``bias [E]`` (fp32) or ``tid2eid [vocab, k]`` on hash layers."""

    def __init__(self, cfg: DeepseekV4Config, layer_id: int, *, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        self.cfg, self.topk = cfg, cfg.n_activated_experts
        self.hash = layer_id < cfg.n_hash_layers
        self.weight = nn.Parameter(torch.empty(cfg.n_routed_experts, cfg.dim, dtype=dtype, device=device))
        if self.hash:
            self.register_buffer("tid2eid", torch.zeros(cfg.vocab_size, self.topk, dtype=torch.int64,
                                                        device=device))
            self.bias = None
        else:
            self.bias = nn.Parameter(torch.empty(cfg.n_routed_experts, dtype=torch.float32, device=device))

    def scores(self, x: torch.Tensor) -> torch.Tensor:
        logits = F.linear(x.float(), self.weight.float())
        if self.cfg.score_func == "softmax":
            return logits.softmax(dim=-1)
        if self.cfg.score_func == "sigmoid":
            return torch.sigmoid(logits)
        return torch.sqrt(F.softplus(logits))

    def forward(self, x: torch.Tensor, token_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(weights [T, k] fp32, expert ids [T, k])`` for tokens ``x [T, dim]`` with ids ``token_ids [T]``."""
        scores = self.scores(x)
        if self.hash:
            idx = self.tid2eid[token_ids].long()
        else:
            biased = scores + self.bias.float()
            idx = torch.sort(biased, dim=-1, descending=True, stable=True).indices[:, : self.topk]
        w = scores.gather(1, idx)
        if self.cfg.score_func != "softmax":
            w = w / w.sum(dim=-1, keepdim=True)
        return w * self.cfg.route_scale, idx


class Expert(nn.Module):
    """A clamped SwiGLU MLP: ``w1``/``w3: [inter, dim]``, ``w2: [dim, inter]``."""

    def __init__(self, cfg: DeepseekV4Config, *, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        kw = dict(dtype=dtype, device=device)
        self.limit = cfg.swiglu_limit
        self.w1 = Linear(cfg.dim, cfg.moe_inter_dim, **kw)
        self.w2 = Linear(cfg.moe_inter_dim, cfg.dim, **kw)
        self.w3 = Linear(cfg.dim, cfg.moe_inter_dim, **kw)

    def forward(self, x: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
        gate, up = self.w1(x).float(), self.w3(x).float()
        if self.limit > 0:
            up = up.clamp(-self.limit, self.limit)
            gate = gate.clamp(max=self.limit)
        h = F.silu(gate) * up
        if weights is not None:
            h = weights[:, None] * h
        return self.w2(h.to(x.dtype))


class MoEWeights(nn.Module):
    """Routed experts plus the shared expert of one block: the parameters, and the torch paths that
    combine them (shared by the reference :class:`MoE` and the serving model's MoE).

    Sharded (``atom.parallel``): this rank computes the routed experts in ``expert_range`` (expert
    parallel: its partition; tensor parallel: all, each a slice) and its slice of the shared expert;
    the ranks' partial sums are combined by one all-reduce. Every rank routes every token (the
    router is replicated), so dispatch needs no communication.
    """

    def __init__(self, cfg: DeepseekV4Config, layer_id: int, *, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None, expert_format: str = "dense") -> None:
        """``expert_format``: the storage every routed expert's Linears are built in (``Linear.set_format``, with
        ``cfg.quant_sim`` as ``act_quant``); a loader passes the checkpoint's, so the thousands of expert Linears
        need no conversion after the build. The shared expert is built dense."""
        super().__init__()
        kw = dict(dtype=dtype, device=device)
        self.gate = Gate(cfg, layer_id, **kw)
        first = Expert(cfg, **kw)  # the others are fresh copies: the same modules, built far faster
        if expert_format != "dense":
            for linear in (first.w1, first.w2, first.w3):
                linear.set_format(expert_format, act_quant=cfg.quant_sim)
        template = ModuleTemplate(first)
        self.experts = nn.ModuleList(first if i == 0 else template.make() for i in range(cfg.n_routed_experts))
        self.shared_experts = Expert(cfg, **kw)
        self.expert_range = range(cfg.n_routed_experts)
        self.comm: Comm = SINGLE_RANK

    @property
    def grouped(self) -> bool:
        """Whether the routed experts can run as one grouped GEMM (:meth:`routed`): every expert held here
        with dense weights. Quantized experts (FP8 / MXFP4: their GEMM ops take one weight each) and
        expert-parallel ranks (other ranks' experts are absent) need :meth:`routed_per_expert`."""
        return len(self.expert_range) == len(self.experts) and self.experts[0].w1.fmt == "dense"

    def with_shared(self, x: torch.Tensor, routed: torch.Tensor) -> torch.Tensor:
        """The layer's output from its routed sum ``routed`` (fp32 ``[T, dim]``): plus the shared expert,
        summed over the ranks, in ``x``'s dtype."""
        return self.comm.all_reduce(routed + self.shared_experts(x).float()).to(x.dtype)

    def routed_per_expert(self, x: torch.Tensor, weights: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """fp32 ``[T, dim]``: one GEMM per expert present in ``idx`` and held on this rank (host-synced)."""
        y = torch.zeros(x.shape[0], x.shape[1], dtype=torch.float32, device=x.device)
        for e in torch.unique(idx).tolist():
            if e not in self.expert_range:
                continue
            rows, slot = torch.nonzero(idx == e, as_tuple=True)
            y.index_add_(0, rows, self.experts[e](x[rows], weights[rows, slot]).float())
        return y

    def routed(self, x: torch.Tensor, weights: torch.Tensor, idx: torch.Tensor) -> torch.Tensor:
        """fp32 ``[T, dim]``: each token's (token, expert) pairs put in ascending expert order, all pairs sorted by
        expert, one grouped GEMM over them (here one batched matmul with each row's expert weights), the outputs
        put back in token order and each token's summed over its experts in ascending order (a sum over the
        pair dim). Shapes depend only on ``T`` and top-k: no per-expert loop, no data-dependent sizes."""
        t, k = idx.shape
        by_expert, slot = torch.sort(idx, dim=1, stable=True)  # each token's experts ascending
        flat = by_expert.view(-1)
        order = torch.sort(flat, stable=True).indices  # grouped by expert, token order inside a group
        out = grouped_swiglu(x[order // k], self.stacked_weights(), flat[order],
                             weights.gather(1, slot).view(-1)[order], self.experts[0].limit)
        back = torch.empty_like(out)
        back[order] = out
        return back.view(t, k, -1).sum(dim=1)

    def stacked_weights(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(w1 [E, inter, dim], w3 [E, inter, dim], w2 [E, dim, inter])`` of the routed experts, stacked once and
        kept until the parameters change (a grouped GEMM reads one weight tensor per projection)."""
        params = [(e.w1.weight, e.w3.weight, e.w2.weight) for e in self.experts]
        key = tuple((p.data_ptr(), p._version) for trio in params for p in trio)
        if getattr(self, "_stack_key", None) != key:
            self._stack = tuple(torch.stack([trio[j] for trio in params]) for j in range(3))
            self._stack_key = key
        return self._stack


class MoE(MoEWeights):
    """The reference MoE sub-layer."""

    def forward(self, x: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
        """``[T, dim] -> [T, dim]``; each token adds its experts' outputs in ascending expert order."""
        weights, idx = self.gate(x, token_ids)
        if self.grouped:
            y = self.routed(x, weights, idx)
        else:
            y = self.routed_per_expert(x, weights, idx)
        return self.with_shared(x, y)


def grouped_swiglu(x: torch.Tensor, w: tuple[torch.Tensor, torch.Tensor, torch.Tensor], expert: torch.Tensor,
                   route_w: torch.Tensor, limit: float) -> torch.Tensor:
    """Torch reference of the grouped expert GEMM: row ``r`` of ``x [R, dim]`` through expert ``expert[r]``
    (clamped SwiGLU, routing weight ``route_w[r]`` on the activation) -> fp32 ``[R, dim]``."""
    w1, w3, w2 = (t[expert] for t in w)
    xr = x.to(w1.dtype)[:, :, None]
    gate, up = (w1 @ xr)[..., 0].float(), (w3 @ xr)[..., 0].float()
    if limit > 0:
        up = up.clamp(-limit, limit)
        gate = gate.clamp(max=limit)
    h = route_w[:, None] * (F.silu(gate) * up)
    return (w2 @ h.to(w2.dtype)[:, :, None])[..., 0].float()
