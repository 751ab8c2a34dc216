"""The KV compressor: ``m`` tokens -> one compressed entry (CSA when m == 4, HCA otherwise).

Contract for the paged engine (every piece is callable on its own):

* ``project(x, positions) -> (kv, score)``: fp32 ``[T, coff*c]`` raw rows per token; ``score`` already includes
  ``ape[pos % m]`` (``project_raw(x)`` gives it without).  ``coff`` = 2 on CSA (overlap), 1 on HCA.  These are
  exactly the rows of the compressor state.
* State ring: CSA ``[8, 2c]`` indexed by ``pos % 8``; HCA ``[m, c]`` indexed by ``pos % m`` (kv and score rings).
* ``block_rows(state, i) -> (kv, score)``: the rows pooled into entry ``i`` read from the ring.  CSA: ``[8, c]`` =
  the "b" half (``[:c]``) of block ``i-1`` (tokens 4i-4..4i-1) then the "a" half (``[c:]``) of block ``i``; block
  ``-1`` is padding (kv = 0, score = -inf) and is never read from the ring.  HCA: ``[m, c]``, the block's rows.
* ``pool(kv_rows, score_rows) -> [c]``: per-channel softmax over the rows of ``score``, weighted sum of ``kv``.
* ``finish(pooled, i) -> [c]``: RMSNorm (own weight), RoPE at position ``i*m``, then the quantization round-trip
  when ``quant_sim`` (main: FP8 on NoPE dims, bf16 on RoPE dims; indexer: Hadamard + FP4).
* ``extend_rows(kv, score, positions, state, entries)`` (``extend`` = ``project`` + this): write each token's
  rows into the ring in order and emit entry ``p // m`` into ``entries`` as soon as token ``p`` completes its
  block.  Prefill and decode share this path, so given the same projected rows the compressed entries are
  bit-identical however the sequence is chunked.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .cache import CompressorState
from .config import DeepseekV4Config
from .layers import Linear, RMSNorm
from .quant import fp4_roundtrip, hadamard_rotate, kv_row_roundtrip
from .rope import apply_rope


class Compressor(nn.Module):
    """Gated pooling compressor of one layer (``head_dim`` = c; ``for_indexer`` selects the FP4 round-trip)."""

    def __init__(self, cfg: DeepseekV4Config, ratio: int, head_dim: int, freqs: torch.Tensor, *,
                 for_indexer: bool = False, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None) -> None:
        super().__init__()
        self.cfg, self.ratio, self.head_dim, self.for_indexer = cfg, ratio, head_dim, for_indexer
        self.overlap = ratio == 4
        coff = 2 if self.overlap else 1
        self.ape = nn.Parameter(torch.empty(ratio, coff * head_dim, dtype=torch.float32, device=device))
        self.wkv = Linear(cfg.dim, coff * head_dim, dtype=dtype, device=device)
        self.wgate = Linear(cfg.dim, coff * head_dim, dtype=dtype, device=device)
        self.norm = RMSNorm(head_dim, cfg.norm_eps, dtype=dtype, device=device)
        self.freqs = freqs

    @property
    def ring_size(self) -> int:
        return 2 * self.ratio if self.overlap else self.ratio

    def project_raw(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """fp32 ``(kv, score)`` before the positional bias (for kernels that add ``ape`` themselves)."""
        xf = x.float()
        return F.linear(xf, self.wkv.weight.float()), F.linear(xf, self.wgate.weight.float())

    def project(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """fp32 state rows ``(kv, score + ape[pos % m])`` for tokens ``x: [T, dim]`` at ``positions: [T]``.

        ``score + ape`` is one fp32 add, so a kernel adding ``ape`` to ``project_raw``'s score is bit-identical."""
        kv, score = self.project_raw(x)
        return kv, score + self.ape[positions % self.ratio]

    def block_rows(self, state: CompressorState, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The ``(kv, score)`` rows pooled into entry ``i``, read from the state ring (see module docstring)."""
        m, c = self.ratio, self.head_dim
        if not self.overlap:
            slots = [(m * i + j) % m for j in range(m)]
            return state.kv[slots], state.score[slots]
        cur = [(4 * i + j) % 8 for j in range(4)]
        if i == 0:
            prev_kv = torch.zeros(4, c, device=state.kv.device)
            prev_score = torch.full((4, c), float("-inf"), device=state.kv.device)
        else:
            prev = [(4 * i - 4 + j) % 8 for j in range(4)]
            prev_kv, prev_score = state.kv[prev, :c], state.score[prev, :c]
        return (torch.cat((prev_kv, state.kv[cur, c:]), 0), torch.cat((prev_score, state.score[cur, c:]), 0))

    @staticmethod
    def pool(kv_rows: torch.Tensor, score_rows: torch.Tensor) -> torch.Tensor:
        """Per-channel softmax over rows of ``score_rows``, then the weighted sum of ``kv_rows``: ``[n, c] -> [c]``."""
        return (kv_rows * score_rows.softmax(dim=0)).sum(dim=0)

    def finish(self, pooled: torch.Tensor, i: int) -> torch.Tensor:
        """Entry ``i`` from its pooled row: RMSNorm, RoPE at ``i * m``, quantization round-trip if enabled."""
        e = self.norm(pooled[None].float())
        e = apply_rope(e, torch.tensor([i * self.ratio], device=e.device), self.freqs)
        if self.cfg.quant_sim:
            if self.for_indexer:
                e = fp4_roundtrip(hadamard_rotate(e), self.cfg.fp4_block)
            else:
                e = kv_row_roundtrip(e, self.cfg.nope_dim, self.cfg.fp8_block)
        return e[0]

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
