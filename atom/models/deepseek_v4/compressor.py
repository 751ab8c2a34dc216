"""The KV compressor: ``m`` tokens -> one compressed entry (CSA or HCA by :mod:`atom.kv_group`: m = 4 is CSA).

Contract for the paged engine (every piece is callable on its own):

* ``project(x, positions) -> (kv, score)``: fp32 ``[T, coff*c]`` raw rows per token; ``score`` already includes
  ``ape[pos % m]`` (``project_raw(x)`` gives it without).  ``coff`` = 2 on CSA (overlap), 1 on HCA.  These are
  exactly the rows of the compressor state.  An engine whose state kernels add ``ape`` themselves sets
  :attr:`Compressor.kernels_add_ape`: ``project`` then returns ``project_raw``'s rows (the same fp32 add happens
  in the kernels, so the state and entries are bit-identical).  :meth:`Compressor.bind_fused_gemm` (a GPU
  backend) runs ``wkv`` and ``wgate`` as one GEMM; ``kv`` and ``score`` are then column views of its product.
* State ring (``state_ring_rows(m)`` rows): CSA ``[8, 2c]`` indexed by ``pos % 8``; HCA ``[m, c]`` indexed by
  ``pos % m`` (kv and score rings).
* ``entry_sources(ids) -> (positions, col, pad)``: the one statement of which rows are pooled into entries
  ``ids [E]``; ``entry_rows(read, ids) -> (kv, score)`` (``[E, R, c]``) applies it given
  ``read(positions [E, R]) -> full-width (kv, score) rows``, and the engine's ``entry_pool`` kernel takes it.  CSA: ``R = 8`` = the "b" half
  (``[:c]``) of block ``i-1`` (tokens 4i-4..4i-1) then the "a" half (``[c:]``) of block ``i``; block ``-1`` is
  padding (kv = 0, score = -inf; ``read`` sees position 0 there and its rows are discarded).  HCA: ``R = m``, the
  block's rows.  The reference reads its ring (``block_rows``); the paged engine reads the chunk's fresh rows or
  its ring, for every entry the step completes at once.
* ``pool(kv_rows, score_rows) -> [..., c]``: per-channel softmax over the rows (dim -2) of ``score``, weighted sum
  of ``kv``; any leading batch dims.
* ``finish_entries(pooled [E, c], ids [E]) -> [E, c]`` (``finish(pooled, i)`` for one): RMSNorm (own weight), RoPE
  at position ``i*m``, then the quantization round-trip when ``quant_sim`` (main: FP8 on NoPE dims, bf16 on RoPE
  dims; indexer: Hadamard + FP4).
* ``extend_rows(kv, score, positions, state, entries)`` (``extend`` = ``project`` + this): write each token's
  rows into the ring in order and emit entry ``p // m`` into ``entries`` as soon as token ``p`` completes its
  block.  Prefill and decode share this path, so given the same projected rows the compressed entries are
  bit-identical however the sequence is chunked.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from atom.kv_group import CSA_OVERLAP_ROWS, is_csa, state_ring_rows

from .cache import CompressorState
from .config import DeepseekV4Config
from .fused_ops import SmallOpsUser
from .layers import Linear, RMSNorm
from .merged_linear import MergedLinear
from .quant import fp4_roundtrip, hadamard_rotate, kv_row_roundtrip
from .rope import apply_rope


class Compressor(SmallOpsUser, nn.Module):
    """Gated pooling compressor of one layer (``head_dim`` = c; ``for_indexer`` selects the FP4 round-trip); the
    entries' RoPE runs with its bound :attr:`small_ops` (:mod:`.fused_ops`)."""

    def __init__(self, cfg: DeepseekV4Config, ratio: int, head_dim: int, freqs: torch.Tensor, *,
                 for_indexer: bool = False, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        self.cfg, self.ratio, self.head_dim, self.for_indexer = cfg, ratio, head_dim, for_indexer
        self.overlap = is_csa(ratio)
        coff = 2 if self.overlap else 1
        self.ape = nn.Parameter(torch.empty(ratio, coff * head_dim, dtype=torch.float32, device=device))
        self.wkv = Linear(cfg.dim, coff * head_dim, dtype=dtype, device=device)
        self.wgate = Linear(cfg.dim, coff * head_dim, dtype=dtype, device=device)
        self.norm = RMSNorm(head_dim, cfg.norm_eps, dtype=dtype, device=device)
        self.freqs = freqs
        #: ``project`` leaves ``ape`` out of the score rows: the engine's state kernels add it (module docstring)
        self.kernels_add_ape = False
        #: ``wkv`` and ``wgate`` as one GEMM (:meth:`bind_fused_gemm`); None: one GEMM each, as the reference
        self.kv_gate: MergedLinear | None = None

    @property
    def ring_size(self) -> int:
        return state_ring_rows(self.ratio)

    def bind_fused_gemm(self, fused: bool) -> str | None:
        """With ``fused`` (a GPU backend) multiply ``wkv`` and ``wgate`` as one GEMM over their weights
        concatenated here, once (:class:`~.merged_linear.MergedLinear`: the parameters become views of the merged
        weight, names and values unchanged). Returns why they stay two GEMMs, or None when merged.

        The projections run in fp32 whatever the model's dtype, so only dense fp32 weights merge (the serving model
        holds them in fp32, ``cast_fp32_weights``); a merged product is the same fp32 GEMM, summed in an order the
        wider output may change in the last bit. ``False`` keeps the reference's two GEMMs (the CPU engine is
        compared with the reference value for value). Bind again after moving or replacing the weights."""
        self.kv_gate = None
        if not fused:
            return None
        if any(lin.fmt != "dense" or lin.weight.dtype != torch.float32 for lin in (self.wkv, self.wgate)):
            return "the compressor projects in fp32: wkv and wgate merge only as dense fp32 weights"
        merged = MergedLinear(self.wkv, self.wgate)
        merged.bind(True)
        if merged.merged is not None:
            self.kv_gate = merged
        return merged.refusal

    def project_raw(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """fp32 ``(kv, score)`` before the positional bias (for kernels that add ``ape`` themselves); column views
        of one product (row stride ``2 * coff * c``) when :meth:`bind_fused_gemm` merged the weights."""
        xf = x.float()
        if self.kv_gate is not None:
            kv, score = self.kv_gate(xf)
            return kv, score
        return F.linear(xf, self.wkv.weight.float()), F.linear(xf, self.wgate.weight.float())

    def project(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """fp32 state rows ``(kv, score + ape[pos % m])`` for tokens ``x: [T, dim]`` at ``positions: [T]``
        (``project_raw``'s rows when :attr:`kernels_add_ape` is set).

        ``score + ape`` is one fp32 add, so a kernel adding ``ape`` to ``project_raw``'s score is bit-identical."""
        kv, score = self.project_raw(x)
        if self.kernels_add_ape:
            return kv, score
        return kv, score + self.ape[positions % self.ratio]

    def entry_sources(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Where the rows of entries ``ids [E]`` come from: ``(positions [E, R], col [R], pad [E, R])``.

        Row ``r`` of entry ``i`` is columns ``col[r] : col[r] + c`` of the state row at ``positions[e, r]``;
        ``pad`` marks the CSA block ``-1`` (kv 0, score -inf).  CSA: positions ``4i-4 .. 4i+3``, ``col`` 0 (the
        "b" half) for the first 4 rows and ``c`` (the "a" half) for the last 4.  HCA: ``mi .. mi+m-1``, col 0."""
        if self.overlap:  # the previous window's overlap rows ("b" half), then this window's ("a" half)
            m, o = self.ratio, CSA_OVERLAP_ROWS
            r = torch.arange(o + m, device=ids.device)
            pos = m * ids[:, None] - o + r
            return pos, torch.where(r < o, 0, self.head_dim).to(torch.int32), pos < 0
        pos = self.ratio * ids[:, None] + torch.arange(self.ratio, device=ids.device)
        return pos, torch.zeros(self.ratio, dtype=torch.int32, device=ids.device), pos < 0

    def entry_rows(self, read: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
                   ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``(kv, score)`` rows ``[E, R, c]`` pooled into entries ``ids`` (see ``entry_sources``)."""
        pos, col, pad = self.entry_sources(ids)
        kv, score = read(pos.clamp(min=0))
        cols = (col.long()[:, None] + torch.arange(self.head_dim, device=ids.device)).expand(*pos.shape, -1)
        kv, score = kv.gather(-1, cols), score.gather(-1, cols)
        return kv.masked_fill(pad[..., None], 0.0), score.masked_fill(pad[..., None], float("-inf"))

    def block_rows(self, state: CompressorState, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``(kv, score)`` rows ``[R, c]`` pooled into entry ``i``, read from the state ring."""
        ring = self.ring_size
        kv, score = self.entry_rows(lambda p: (state.kv[p % ring], state.score[p % ring]),
                                    torch.tensor([i], device=state.kv.device))
        return kv[0], score[0]

    @staticmethod
    def pool(kv_rows: torch.Tensor, score_rows: torch.Tensor) -> torch.Tensor:
        """Per-channel softmax over the rows of ``score_rows``, then the weighted sum of ``kv_rows``:
        ``[..., n, c] -> [..., c]``."""
        return (kv_rows * score_rows.softmax(dim=-2)).sum(dim=-2)

    def finish_entries(self, pooled: torch.Tensor, ids: torch.Tensor,
                       positions: torch.Tensor | None = None) -> torch.Tensor:
        """Entries ``ids [E]`` from their pooled rows ``[E, c]``: RMSNorm, RoPE at ``i * m``, quantization
        round-trip if enabled. ``positions``: ``ids * m`` when the caller already has it (an engine computes it
        once per step for every layer), else computed here."""
        e = self.norm(pooled.float())
        e = apply_rope(e, ids * self.ratio if positions is None else positions, self.freqs, kernels=self.small_ops)
        if self.cfg.quant_sim:
            if self.for_indexer:
                e = fp4_roundtrip(hadamard_rotate(e), self.cfg.fp4_block)
            else:
                e = kv_row_roundtrip(e, self.cfg.nope_dim, self.cfg.fp8_block)
        return e

    def finish(self, pooled: torch.Tensor, i: int) -> torch.Tensor:
        """Entry ``i`` from its pooled row ``[c]`` (``finish_entries`` for one entry)."""
        return self.finish_entries(pooled[None], torch.tensor([i], device=pooled.device))[0]

    def extend(self, x: torch.Tensor, positions: torch.Tensor, state: CompressorState,
               entries: torch.Tensor) -> list[int]:
        """``project`` then ``extend_rows``."""
        kv, score = self.project(x, positions)
        return self.extend_rows(kv, score, positions, state, entries)

    def extend_rows(self, kv: torch.Tensor, score: torch.Tensor, positions: torch.Tensor, state: CompressorState,
                    entries: torch.Tensor) -> list[int]:
        """Feed projected rows in position order; returns the ids of the entries completed (and written)."""
        ring, done = self.ring_size, []
        for j, p in enumerate(positions.tolist()):
            state.kv[p % ring] = kv[j]
            state.score[p % ring] = score[j]
            if (p + 1) % self.ratio == 0:
                i = p // self.ratio
                if i >= entries.shape[0]:
                    raise ValueError(f"cache capacity exceeded: entry {i} needs capacity > {p}")
                entries[i] = self.finish(self.pool(*self.block_rows(state, i)), i).to(entries.dtype)
                done.append(i)
        return done
