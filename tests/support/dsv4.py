"""Helpers for the DeepSeek-V4 reference model tests (imported by the test modules; see conftest.py)."""

from __future__ import annotations

import torch

from atom.models.deepseek_v4 import DeepseekV4Config, DeepseekV4Model, SequenceCache
from atom.models.deepseek_v4.checkpoint import random_state_dict

SEQ = 40  # > 2 HCA(16) blocks, > top-k CSA candidates, 5 wraps of the 8-row window


def build(cfg: DeepseekV4Config, seed: int = 0) -> DeepseekV4Model:
    model = DeepseekV4Model(cfg)
    model.load_state_dict(random_state_dict(cfg, seed))
    return model.eval()


def tokens(n: int = SEQ, seed: int = 1, vocab: int = 512) -> torch.Tensor:
    return torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed))


def run_chunks(model: DeepseekV4Model, toks: torch.Tensor, sizes: list[int],
               cache: SequenceCache | None = None) -> tuple[torch.Tensor, SequenceCache]:
    """Run ``toks`` through a fresh cache in chunks of the given sizes (the last size repeats)."""
    cache = cache or model.new_cache(128)
    outs, pos, k = [], 0, 0
    while pos < toks.numel():
        size = sizes[min(k, len(sizes) - 1)]
        outs.append(model.extend(cache, toks[pos : pos + size], pos).logits)
        pos += min(size, toks.numel() - pos)
        k += 1
    return torch.cat(outs), cache


def state_equal(a: SequenceCache, b: SequenceCache, model: DeepseekV4Model) -> bool:
    """The section 4.2 boundary states of two caches are bit-identical (NaN-safe)."""
    sa, sb = model.snapshot(a), model.snapshot(b)
    if (sa.num_tokens, sa.mtp_tokens) != (sb.num_tokens, sb.mtp_tokens):
        return False
    ta, tb = _flat(sa), _flat(sb)
    return len(ta) == len(tb) and all(torch.equal(x, y) for x, y in zip(ta, tb))


def _flat(snap: object) -> list[torch.Tensor]:
    out = []
    for ls in snap.layers:  # type: ignore[attr-defined]
        out.append(ls.swa_rows)
        for t in (ls.entries, ls.index_keys):
            if t is not None:
                out.append(t)
        for rows in (ls.state_rows, ls.index_state_rows):
            if rows is not None:
                out += list(rows)
    return out

