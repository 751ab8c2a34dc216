"""DeepSeek-V4 attention: sliding window + (CSA top-k | HCA all) compressed entries, one shared K=V row.

Per token at position t (``x`` = the block's normalised input):

* ``project_q``: ``qr = q_norm(wq_a(x))``; ``q = wq_b(qr)`` as ``[H, c]``, per-head RMS norm without weight, RoPE
  on the last ``rope_head_dim`` dims.  Returns ``(q, qr)``; the indexer reuses ``qr``.
* ``project_kv``: ``kv = kv_norm(wkv(x))``, RoPE on the tail, FP8 round-trip of the NoPE dims and bf16 round-trip of
  the RoPE dims when ``quant_sim``.
  This row is what the SWA ring stores and what attention reads as both key and value.
* rows of query t: window rows of positions ``max(0, t-W+1) .. t`` (oldest first, own row included), then the
  compressed entries (CSA: indexer picks, ascending; HCA: all ``i < (t+1)//m``).
* ``attend(q, rows, sink)``: softmax over ``q.rows * c^-0.5`` with ``exp(sink_h)`` added to the denominator only.
* ``project_out``: inverse RoPE at t on each head's tail, grouped ``wo_a`` (one slice per group), then ``wo_b``.

``project`` (token-local) -> ``core`` (cache update, per-query gather + attend) -> ``project_out`` (token-local).
``AttentionWeights`` holds the parameters and the token-local parts (shared with the serving model's arena
attention); ``Attention`` adds the reference's ``core`` over the explicit cache.
Attention is computed one query at a time so a query's result never depends on the chunk it was computed in; with
``cfg.batch_invariant`` the token-local parts run one token at a time too (``map_rows``).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from atom.kv_group import is_csa
from atom.comm import SINGLE_RANK, Comm

from .cache import LayerCache
from .compressor import Compressor
from .config import DeepseekV4Config
from .fused_ops import SmallOpsUser
from .indexer import Indexer
from .layers import Linear, RMSNorm, map_rows
from .merged_linear import MergedLinear
from .quant import kv_row_roundtrip
from .rope import apply_rope, layer_frequencies, normed_rope


class Projections(NamedTuple):
    """Token-local projections of one layer, rows per token.

    ``q [T, H, c]`` (normed, rotated); ``kv [T, c]`` (cache-ready row); ``comp = (kv, score)`` compressor state
    rows ``[T, coff*c]`` fp32; ``index_q [T, nI, cI]``, ``index_w [T, nI]`` and ``index_comp`` (indexer
    compressor rows ``[T, 2*cI]``) on CSA layers.  Absent parts are ``None``.
    """

    q: torch.Tensor
    kv: torch.Tensor
    comp: tuple[torch.Tensor, torch.Tensor] | None = None
    index_q: torch.Tensor | None = None
    index_w: torch.Tensor | None = None
    index_comp: tuple[torch.Tensor, torch.Tensor] | None = None


def attend(q: torch.Tensor, rows: torch.Tensor, sink: torch.Tensor, scale: float) -> torch.Tensor:
    """One query's attention: ``q [H, c]`` over ``rows [n, c]`` (keys = values), per-head ``sink [H]``."""
    s = (q.float() @ rows.float().T) * scale
    mx = torch.maximum(s.amax(dim=-1), sink.float())
    p = torch.exp(s - mx[:, None])
    denom = p.sum(dim=-1) + torch.exp(sink.float() - mx)
    return (p @ rows.float()) / denom[:, None]


class AttentionWeights(SmallOpsUser, nn.Module):
    """The parameters of block ``layer_id``'s attention and its token-local math (the projections in, the
    output projection out), shared by the reference :class:`Attention` and the serving model's arena
    attention: both hold the same parameter names, so both load the same checkpoint. Its rotations run with
    its bound :attr:`small_ops` (:mod:`.fused_ops`; the torch arithmetic unless the serving model binds one)."""

    def __init__(self, cfg: DeepseekV4Config, layer_id: int, *, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        self.cfg, self.layer_id = cfg, layer_id
        self.ratio = cfg.ratio(layer_id)
        self.n_heads, self.head_dim = cfg.n_heads, cfg.head_dim
        # tensor parallel: this rank's query heads and output groups, and the all-reduce after wo_b
        self.n_groups = cfg.o_groups
        self.comm: Comm = SINGLE_RANK
        self.scale = cfg.head_dim**-0.5
        self.freqs = layer_frequencies(cfg, self.ratio)
        kw = dict(dtype=dtype, device=device)
        self.wq_a = Linear(cfg.dim, cfg.q_lora_rank, **kw)
        self.q_norm = RMSNorm(cfg.q_lora_rank, cfg.norm_eps, **kw)
        self.wq_b = Linear(cfg.q_lora_rank, cfg.n_heads * cfg.head_dim, **kw)
        self.wkv = Linear(cfg.dim, cfg.head_dim, **kw)
        self.kv_norm = RMSNorm(cfg.head_dim, cfg.norm_eps, **kw)
        group_in = cfg.n_heads * cfg.head_dim // cfg.o_groups
        self.wo_a = Linear(group_in, cfg.o_groups * cfg.o_lora_rank, **kw)
        self.wo_b = Linear(cfg.o_groups * cfg.o_lora_rank, cfg.dim, **kw)
        self.attn_sink = nn.Parameter(torch.empty(cfg.n_heads, dtype=torch.float32, device=device))
        self.compressor = Compressor(cfg, self.ratio, cfg.head_dim, self.freqs, **kw) if self.ratio else None
        self.indexer = Indexer(cfg, self.freqs, **kw) if is_csa(self.ratio) else None
        # the GEMM layout of bind_fused_gemms; None / False: the reference's (each linear on its own, wo_a copied)
        self.in_proj: MergedLinear | None = None
        self.q_proj: MergedLinear | None = None
        self.wo_a_into_rows = False

    def bind_fused_gemms(self, fused: bool) -> None:
        """With ``fused`` (a GPU backend) the linears that read one input run as one GEMM each (see
        :mod:`.merged_linear`): ``wq_a`` and ``wkv`` (the normed input), ``wq_b`` and the indexer's ``wq_b``
        (``qr``); and the grouped ``wo_a`` writes its product straight into the ``[T, g * r]`` rows ``wo_b`` reads
        (:meth:`project_out`). Call after the weights are loaded and the GEMMs bound (and again after replacing or
        moving them). ``False`` keeps the reference's GEMMs: a wider or strided product may sum in another order
        (on the CPU a strided batched output is computed batch by batch), and the CPU engine is compared with the
        reference value for value."""
        self.wo_a_into_rows = fused
        if not fused:
            self.in_proj = self.q_proj = None
            return
        self.in_proj = MergedLinear(self.wq_a, self.wkv)
        self.q_proj = MergedLinear(self.wq_b, *(() if self.indexer is None else (self.indexer.wq_b,)))
        self.in_proj.bind(True)
        self.q_proj.bind(True)

    # ----- separately callable pieces -----------------------------------------------------------------------------
    def project_q(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(q [T, H, c], qr [T, q_lora_rank])`` for ``x [T, dim]`` at ``positions [T]``."""
        qr = self.q_norm(self.wq_a(x))
        return self.heads_q(self.wq_b(qr), positions), qr

    def heads_q(self, q: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The queries ``[T, H, c]`` from ``wq_b``'s output ``[T, H * c]``: per-head RMS norm, then RoPE."""
        return normed_rope(q.unflatten(-1, (self.n_heads, self.head_dim)), None, self.cfg.norm_eps, positions,
                           self.freqs, kernels=self.small_ops)

    def project_kv(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The shared K=V rows ``[T, c]`` exactly as cached (normed, rotated, round-tripped)."""
        return self.finish_kv(self.wkv(x), positions)

    def finish_kv(self, kv: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """The cached K=V rows from ``wkv``'s output ``[T, c]``: ``kv_norm``, RoPE, the release's round trip."""
        kv = apply_rope(self.kv_norm(kv), positions, self.freqs, kernels=self.small_ops)
        if self.cfg.quant_sim:
            kv = kv_row_roundtrip(kv, self.cfg.nope_dim, self.cfg.fp8_block)
        return kv

    def project_out(self, o: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Inverse RoPE at the query positions, grouped ``wo_a``, then ``wo_b``: ``[T, H, c] -> [T, dim]``.

        Tensor parallel: ``o`` holds this rank's heads, ``wo_b`` its input columns (row-parallel), and
        the ranks' partial outputs are summed."""
        o = apply_rope(o, positions, self.freqs, inverse=True, kernels=self.small_ops)
        t, g, r = o.shape[0], self.n_groups, self.cfg.o_lora_rank
        wo_a = self.wo_a.weight.view(g, r, -1)
        o = o.reshape(t, g, -1).to(wo_a.dtype).transpose(0, 1)  # [g, T, d]
        if self.wo_a_into_rows:  # the batched GEMM writes group g of token t at z[t, g]: no copy (GPU backends)
            z = torch.empty(t, g, r, dtype=wo_a.dtype, device=o.device)
            torch.bmm(o, wo_a.transpose(1, 2), out=z.transpose(0, 1))
        else:  # an explicit copy to [T, g, r]: a reshape would copy for T > 1 only (op count independent of T)
            z = torch.bmm(o, wo_a.transpose(1, 2)).transpose(0, 1).clone(memory_format=torch.contiguous_format)
        return self.comm.all_reduce(self.wo_b(z.view(t, -1)))

    def index_weights(self, x: torch.Tensor) -> torch.Tensor:
        """``Projections.index_w`` of ``x`` (CSA layers): the indexer's head weights."""
        return self.indexer.head_weights(x)

    def project(self, x: torch.Tensor, positions: torch.Tensor) -> Projections:
        """All token-local projections of this layer for ``x [T, dim]`` (see ``Projections``): ``project_q`` and
        ``project_kv``'s math, with ``wq_a`` / ``wkv`` and the two ``wq_b`` through their merged GEMMs."""
        q_a, kv = (self.wq_a(x), self.wkv(x)) if self.in_proj is None else self.in_proj(x)
        qr = self.q_norm(q_a)
        if self.q_proj is None:
            q_b = (self.wq_b(qr), None if self.indexer is None else self.indexer.wq_b(qr))
        else:
            q_b = self.q_proj(qr)
        p = Projections(q=self.heads_q(q_b[0], positions), kv=self.finish_kv(kv, positions))
        if self.compressor is not None:
            p = p._replace(comp=self.compressor.project(x, positions))
        if self.indexer is not None:
            p = p._replace(index_q=self.indexer.heads_q(q_b[1], positions), index_w=self.index_weights(x),
                           index_comp=self.indexer.compressor.project(x, positions))
        return p


class Attention(AttentionWeights):
    """The reference attention sub-layer of block ``layer_id``: one chunk over the explicit cache."""

    def attend(self, q: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """One query ``[H, c]`` over its gathered rows ``[n, c]`` with this layer's sinks -> ``[H, c]``."""
        return attend(q, rows, self.attn_sink, self.scale)

    # ----- the reference forward over one chunk -------------------------------------------------------------------
    def core(self, p: Projections, lc: LayerCache, start_pos: int) -> torch.Tensor:
        """Cache update + attention for one chunk at ``start_pos ..``: ``-> o [T, H, c]`` (fp32).

        Order matters and mirrors decode: SWA rows are read before the ring is overwritten; the compressors emit
        every entry completed inside the chunk before any query attends; causality is enforced per query.
        """
        T, W = p.kv.shape[0], self.cfg.window_size
        positions = torch.arange(start_pos, start_pos + T, device=p.kv.device)
        first = max(0, start_pos - W + 1)
        prev = lc.swa[[q % W for q in range(first, start_pos)]]
        recent = torch.cat((prev.to(p.kv.dtype), p.kv), dim=0)  # positions first .. start_pos+T-1
        for q in range(max(start_pos, start_pos + T - W), start_pos + T):
            lc.swa[q % W] = p.kv[q - start_pos].to(lc.swa.dtype)
        picks = None
        if self.compressor is not None:
            assert lc.state is not None and lc.entries is not None and p.comp is not None
            self.compressor.extend_rows(*p.comp, positions, lc.state, lc.entries)
        if self.indexer is not None:
            assert lc.index_state is not None and lc.index_keys is not None and p.index_comp is not None
            self.indexer.compressor.extend_rows(*p.index_comp, positions, lc.index_state, lc.index_keys)
            picks = self.indexer.select_chunk(p.index_q, p.index_w, positions, lc.index_keys)
        outs = []
        for j in range(T):
            t = start_pos + j
            rows = recent[max(0, t - W + 1) - first : t - first + 1]
            if picks is not None:
                rows = torch.cat((rows, lc.entries[picks[j]].to(rows.dtype)), dim=0)
            elif self.compressor is not None:
                rows = torch.cat((rows, lc.entries[: (t + 1) // self.ratio].to(rows.dtype)), dim=0)
            outs.append(self.attend(p.q[j], rows))
        return torch.stack(outs)

    def forward(self, x: torch.Tensor, lc: LayerCache, start_pos: int) -> torch.Tensor:
        """Attention for chunk ``x [T, dim]`` at positions ``start_pos ..``; updates ``lc`` in place."""
        rw = self.cfg.batch_invariant
        positions = torch.arange(start_pos, start_pos + x.shape[0], device=x.device)
        o = self.core(map_rows(self.project, rw, x, positions), lc, start_pos)
        return map_rows(self.project_out, rw, o.to(x.dtype), positions)
