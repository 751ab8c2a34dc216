"""The serving model's MoE sub-layer: the reference's parameters (:class:`MoEWeights`), its own dispatch.

Routing is the reference's (``Gate``: the same scores, the same top-k or hash picks); on a GPU backend the
router GEMM is followed by one ``moe_route`` launch, the shared expert's ``w1`` and ``w3`` are one GEMM over
weights concatenated once at bind (``MergedLinear``; two where the merge is refused) and its SwiGLU is one
``swiglu`` launch reading the two halves of that product.
The routed experts run through the ``fused_moe`` kernel op (:mod:`atom.kernels.fused_moe`): the (token, expert)
pairs sorted by expert on the device, one grouped GEMM for ``w1`` / ``w3`` with the clamped SwiGLU and the routing
weight, one for ``w2`` with the combine, dense, FP8 or MXFP4 experts alike; the shared expert runs first and the
op's output starts as its output, so ``routed + shared`` is no launch of its own. The op takes the held experts'
weights stacked: on the first forward (and again if the parameters are replaced) each projection's weights
and scales are stacked once and every expert's parameters become views of the stack, so the stack costs no
second copy and the reference's per-expert modules (and state dict names) stay as they are.

On the torch backend (the CPU) the routed experts run the reference's own paths instead (one grouped
GEMM for dense experts, one GEMM per expert present for quantized ones): the engine is compared with the
reference model value for value, and with the release numerics a last-bit difference in a GEMM's
accumulation order flips an FP8 rounding of the activations downstream. The fused op's torch reference
stays the oracle the Triton kernel is checked against; a runner whose decode steps are recorded in graphs
binds the layer with ``host_free=True``, and quantized or partitioned experts then run that reference on
the torch backend too (nothing read back, so the CPU emulation of capture can record them).

A tensor-parallel rank holds a slice of every expert's intermediate width (``w1`` / ``w3`` rows, ``w2``
inputs): the same fused op on smaller stacks, its partial sums all-reduced with the shared expert's. When
the rank's ``w2`` inputs are narrower than their FP8 block (a ``quantize_input`` override that exchanges the
blocks' maxima), that override is the op's ``h_quant``: one all-gather per layer, nothing read back. A layer
whose experts mix formats runs one GEMM per expert present in the step, which reads the routing back.
:attr:`ServingMoE.host_free` says which: the serving model declares CUDA-graph support from it.

Under data-parallel attention the layer's :attr:`ServingMoE.exchange` sends the routed rows to the ranks
holding their experts and brings the partial sums back; the experts a rank holds run the same paths on the
rows it receives (:meth:`ServingMoE.held_routed`), and the shared expert runs on the replica's own tokens.
"""

from __future__ import annotations

from typing import Any, Callable

import torch
import torch.nn.functional as F

from atom.models.deepseek_v4.layers import Linear
from atom.models.deepseek_v4.merged_linear import MergedLinear
from atom.models.deepseek_v4.moe import Expert, MoEWeights

__all__ = ["ServingMoE"]

_PROJECTIONS = ("w1", "w3", "w2")


class ServingMoE(MoEWeights):
    """Routed experts plus the shared expert of one serving block (``[T, dim] -> [T, dim]``)."""

    _fused: Callable[..., torch.Tensor] | None = None
    _fused_source = "torch"
    _swiglu: Callable[..., torch.Tensor] | None = None
    _route: Callable[..., tuple[torch.Tensor, torch.Tensor]] | None = None
    #: the shared expert's ``w1`` and ``w3`` (both read the normed input): one GEMM on a GPU backend, merged
    #: once by :meth:`bind_kernels`; the torch backend keeps two (the reference's GEMMs, value for value)
    _shared_w13: MergedLinear | None = None
    #: set by ``shard_model`` under data-parallel attention: the dispatch/combine of the routed rows (an
    #: ``atom.parallel.expert_exchange.ExpertExchange``; not imported here: the model does not depend on the
    #: package that shards it)
    exchange: Any = None

    #: on the torch backend, run routed experts that cannot be grouped there (quantized ones, or this rank's
    #: partition of them) through ``fused_moe``'s torch reference (one grouped GEMM per projection over the
    #: expert-sorted pairs, nothing read back) instead of one GEMM per expert present: set by
    #: ``bind_kernels(..., host_free=True)``, for runners whose decode steps are recorded in graphs
    _grouped_reference = False

    def bind_kernels(self, kernels: Any, *, host_free: bool = False) -> None:
        """Run the routed experts with ``kernels``' ``fused_moe`` (a ``KernelSet``; None: the torch reference);
        ``host_free``: on the torch backend too whenever the experts fit it (:attr:`_grouped_reference`)."""
        self._fused = None if kernels is None else kernels.fused_moe
        self._fused_source = "torch" if kernels is None else kernels.sources["fused_moe"]
        self._grouped_reference = host_free and kernels is not None
        gpu = kernels is not None and kernels.sources["swiglu"] != "torch"
        self._swiglu = kernels.swiglu if gpu else None
        self._route = kernels.moe_route if gpu else None
        ex = self.shared_experts
        self._shared_w13 = MergedLinear(ex.w1, ex.w3)  # after the Linears' bind_gemm: the merge copies their GEMM
        self._shared_w13.bind(merge=gpu)  # refused (FP8 rows off the 128 grid, split Linears): two GEMMs

    def _held(self) -> list[Expert]:
        return [self.experts[e] for e in self.expert_range]

    def _first_held(self) -> Expert:
        """The first held expert, which speaks for all of them (one format, one split): no list of every held
        module built on the step's path."""
        return self.experts[self.expert_range.start]

    @property
    def fusable(self) -> bool:
        """Whether the held experts fit the fused op: one storage format for every projection, and ``w1`` /
        ``w3``'s FP8 activation blocks those of :class:`Linear` (``w2``'s may be a split layer's, passed to the
        op as its ``h_quant``: :meth:`h_rounding`)."""
        first = self._first_held()
        fmt = first.w1.fmt
        return all(getattr(first, p).fmt == fmt for p in _PROJECTIONS) and all(
            type(getattr(first, p)).quantize_input is Linear.quantize_input for p in ("w1", "w3"))

    def h_rounding(self) -> tuple[int, Callable[[torch.Tensor], torch.Tensor] | None]:
        """How the fused op rounds the activations in front of ``w2``: ``(act_block, None)``, the op's own FP8
        blocks; or ``(0, w2.quantize_input)`` when the held ``w2`` overrides it (a tensor-parallel slice whose
        FP8 input blocks span ranks: each row's block maxima are all-gathered, so every rank rounds as the
        unsplit layer does). Every expert's ``w2`` shares the layer's split, so the first one's serves all."""
        w2 = self._first_held().w2
        if w2.act_block and type(w2).quantize_input is not Linear.quantize_input:
            return 0, w2.quantize_input
        return w2.act_block, None

    @property
    def host_free(self) -> bool:
        """Whether :meth:`forward` runs without reading a device value back, so a CUDA graph can record it:
        the fused op on a GPU backend; on the torch backend the grouped dense path, or the fused op's reference
        when bound ``host_free`` (otherwise quantized or partitioned experts run one GEMM per expert there)."""
        # under data-parallel attention (an exchange) the bucketed decode steps that graphs record run the
        # fixed-capacity exchange, which reads nothing back, at a key every replica shares
        # (atom.parallel.dp_graphs); the counted exchange of other steps runs eagerly
        if self._fused_source == "torch":
            return self.grouped or (self._grouped_reference and self.fusable)
        return self.fusable

    def expert_stack(self) -> tuple[list[torch.Tensor], list[torch.Tensor | None]]:
        """``([w1, w3, w2], [s1, s3, s2])`` stacked over the held experts (scales None when dense); the experts'
        parameters are views of these tensors."""
        stack = getattr(self, "_expert_stack", None)
        if stack is not None and self._views_of(stack[0][0]):
            return stack
        held = self._held()
        weights, scales = [], []
        with torch.no_grad():
            for p in _PROJECTIONS:
                linears = [getattr(ex, p) for ex in held]
                w = torch.stack([lin.weight.data for lin in linears])
                s = None if linears[0].scale is None else torch.stack([lin.scale.data for lin in linears])
                for j, lin in enumerate(linears):
                    lin.weight.data = w[j]
                    if s is not None:
                        lin.scale.data = s[j]
                weights.append(w)
                scales.append(s)
        self._expert_stack = (weights, scales)
        return self._expert_stack

    def _views_of(self, w1: torch.Tensor) -> bool:
        """Whether the first and last held experts' ``w1`` weights are still their rows of the stacked ``w1``
        (checked at the ends only: the held list is hundreds of modules, built every step). Storage identity
        and offset, not ``data_ptr``: the same answer on real tensors, and no data pointer read on fake ones
        (the fake-device check, ``atom.bench.gpu_readiness``), where reading it is deprecated."""
        storage, rows = w1.untyped_storage()._cdata, w1.stride(0)
        for j in (0, len(self.expert_range) - 1):
            weight = self.experts[self.expert_range[j]].w1.weight
            if weight.untyped_storage()._cdata != storage or weight.storage_offset() != w1.storage_offset() + j * rows:
                return False
        return True

    def stacked_weights(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(w1, w3, w2)`` for the reference's grouped GEMM (:meth:`MoEWeights.routed`, the torch backend's dense
        path): the :meth:`expert_stack` tensors, the same values. The experts' parameters are views of them, so a
        step checks two pointers where the reference keys its own copy on every parameter's pointer and version
        (768 module attribute reads per layer at 256 experts, several ms of a CPU decode step's layer)."""
        w1, w3, w2 = self.expert_stack()[0]
        return w1, w3, w2

    def forward(self, x: torch.Tensor, token_ids: torch.Tensor) -> torch.Tensor:
        """Each token adds its experts' outputs (ascending expert order in the torch reference), then the
        shared expert's. Under data-parallel attention (:attr:`exchange` set) the rows are routed here and
        the experts run on the ranks that hold them (:meth:`ExpertExchange.run_experts`)."""
        weights, idx = self.route(x, token_ids)
        if self.exchange is not None:
            return self.with_shared(x, self.exchange.run_experts(x, weights, idx, self.held_routed))
        if self.runs_fused_op:  # the shared expert first: the fused op's output starts as it (no add launched)
            return self.comm.all_reduce(self.held_routed(x, weights, idx, self.shared_output(x))).to(x.dtype)
        return self.with_shared(x, self.held_routed(x, weights, idx))

    def pad_experts(self, rows: int, dtype: torch.dtype) -> None:
        """A padding step's part of this layer: ``rows`` zero rows of the stream's ``dtype`` (token id 0) routed
        and sent through :attr:`exchange`, so this rank makes the same collectives as the ranks running real
        tokens (output dropped; nothing else runs: no attention, no KV write, no shared expert)."""
        if self.exchange is None:
            raise ValueError("a padding step exchanges MoE rows between attention replicas; this layer has no "
                             "exchange (data_parallel_size is 1)")
        x = torch.zeros(rows, self.gate.weight.shape[1], dtype=dtype, device=self.gate.weight.device)
        weights, idx = self.gate(x, torch.zeros(rows, dtype=torch.int64, device=x.device))
        self.exchange.run_experts(x, weights, idx, self.held_routed)

    @property
    def runs_fused_op(self) -> bool:
        """Whether :meth:`held_routed` runs the ``fused_moe`` op (the bound kernel, or its reference when bound
        ``host_free`` on the torch backend); otherwise the reference's own paths (the CPU: its rounding, op for
        op; grouped dense experts are host-free already) or one GEMM per expert (experts the op cannot take)."""
        if self._fused_source == "torch":
            return not self.grouped and self._grouped_reference and self.fusable
        return self.fusable

    def held_routed(self, x: torch.Tensor, weights: torch.Tensor, idx: torch.Tensor,
                    shared: torch.Tensor | None = None) -> torch.Tensor:
        """fp32 ``[T, dim]``: each row's sum over the experts held here (whole, or this rank's slice of each)
        among its chosen ``idx`` with routing ``weights``; plus ``shared`` (the shared expert's output, in
        fp32, added after the routed sum as :meth:`with_shared` adds it) when given, which only the fused op
        takes (:attr:`runs_fused_op`)."""
        if not self.runs_fused_op:
            if shared is not None:
                raise ValueError("held_routed: only the fused op adds the shared expert's output (runs_fused_op)")
            if self._fused_source == "torch" and self.grouped:
                return self.routed(x, weights, idx)
            return self.routed_per_expert(x, weights, idx)
        (w1, w3, w2), (s1, s3, s2) = self.expert_stack()
        first = self._first_held()
        xe = x.to(first.w1.weight.dtype if first.w1.fmt == "dense" else first.w1.dtype)
        h_block, h_quant = self.h_rounding()
        return self._fused(xe, weights, idx, w1, w3, w2, s1, s3, s2, limit=first.limit,
                           act_blocks=(first.w1.act_block, h_block), first_expert=self.expert_range.start,
                           h_quant=h_quant, shared=shared)

    def shared_output(self, x: torch.Tensor) -> torch.Tensor:
        """The shared expert's output ``[T, dim]`` (this rank's partial sum under tensor parallelism); on a GPU
        backend ``w1`` and ``w3`` are one GEMM (:attr:`_shared_w13`) whose two column halves the clamped SwiGLU
        kernel (``swiglu``) reads in place, then ``w2``."""
        ex = self.shared_experts
        if self._swiglu is None or self._shared_w13 is None:
            return ex(x)
        gate, up = self._shared_w13(x)
        return ex.w2(self._swiglu(gate, up, float(ex.limit), x.dtype))

    def with_shared(self, x: torch.Tensor, routed: torch.Tensor) -> torch.Tensor:
        """The layer's output from its routed sum (fp32 ``[T, dim]``), as ``MoEWeights.with_shared`` (the paths
        whose routed sum is not the fused op's, which adds the shared output itself: :meth:`forward`)."""
        return self.comm.all_reduce(routed + self.shared_output(x).float()).to(x.dtype)

    def route(self, x: torch.Tensor, token_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The gate's ``(weights [T, k], idx [T, k])``; on a GPU backend the router GEMM then one ``moe_route``
        launch (scores, top-k or the hash table's picks for the token ids, normalised weights) instead of the
        reference's chain of ops."""
        g = self.gate
        if self._route is None:
            return g(x, token_ids)
        logits = F.linear(x.float(), g.weight.float())
        if g.hash:  # the kernel gathers each token's row of the table itself
            return self._route(logits, None, g.tid2eid, g.topk, g.cfg.score_func, float(g.cfg.route_scale),
                               token_ids=token_ids)
        return self._route(logits, g.bias.float(), None, g.topk, g.cfg.score_func, float(g.cfg.route_scale))
