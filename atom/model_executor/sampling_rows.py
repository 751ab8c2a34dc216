"""A step's sampling requests laid out as per-row parameter tensors, shipped to the device in one copy.

The sampler runs every request of a step through the same batched ops (:mod:`sampler`), so each
request's parameters become columns of per-row tensors: a request with ``k`` drafts owns ``k + 1``
consecutive rows of the logits (row ``i`` gives the token at output position ``position + i``); a
request without drafts owns one. Everything the host knows (parameters, seeds, positions, drafts,
``logit_bias`` pairs, tokens ``min_tokens`` bans, which history row holds a request's penalties state,
the ``[requests, k_max + 1]`` map from requests to rows, the ids of histories that start this step) is
written into one float64 host buffer
(exact for ids, seeds split in 32-bit halves, and fp32 parameters), copied once (pinned and
non-blocking on a GPU) and sliced on the device. :class:`RowBatch` also keeps the host-side facts
that decide which ops run (``any_*`` flags): a fixed set of ops for each combination of features the
batch uses, never a per-row branch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from atom.sampling_params import SamplingParams

__all__ = ["SampleRequest", "RowBatch", "DeviceRows", "NewHistory"]

# per-row columns of the packed buffer
_COLS = ("temperature", "top_k", "top_p", "min_p", "repetition", "frequency", "presence",
         "seed_lo", "seed_hi", "seeded", "position", "draft", "slot")


@dataclass(frozen=True)
class SampleRequest:
    """One request's share of a step: ``1 + len(drafts)`` rows of the logits from its first sampled
    position ``position``; ``slot``: its row in the sampler's history tables (0 = no history);
    ``banned``: token ids impossible at this step (``min_tokens`` not yet reached)."""

    seq_id: int
    params: SamplingParams
    position: int
    drafts: tuple[int, ...] = ()
    slot: int = 0
    banned: tuple[int, ...] = ()

    @property
    def num_rows(self) -> int:
        return 1 + len(self.drafts)


@dataclass(frozen=True)
class NewHistory:
    """A history row the sampler starts (a request admitted or resumed with penalties or ``min_tokens``):
    ``slot`` its row in the history tables, ``seen`` the ids it holds so far (prompt and output), ``counted``
    its output ids (each counted once per occurrence)."""

    slot: int
    seen: tuple[int, ...]
    counted: tuple[int, ...]


@dataclass(frozen=True)
class DeviceRows:
    """The device tensors of a step's rows (``N`` rows, ``R`` requests, ``K`` = most drafts of a request)."""

    temperature: torch.Tensor  # fp32 [N] (0 = greedy)
    top_k: torch.Tensor  # int64 [N] (0 = off)
    top_p: torch.Tensor  # fp32 [N]
    min_p: torch.Tensor  # fp32 [N]
    repetition: torch.Tensor  # fp32 [N]
    frequency: torch.Tensor  # fp32 [N]
    presence: torch.Tensor  # fp32 [N]
    seed_lo: torch.Tensor  # int64 [N]
    seed_hi: torch.Tensor  # int64 [N]
    seeded: torch.Tensor  # bool [N]
    position: torch.Tensor  # int64 [N]: the output position the row samples
    draft: torch.Tensor  # int64 [N]: the draft the row verifies, -1 for a request's last row
    slot: torch.Tensor  # int64 [N]: history row (0: none)
    request_rows: torch.Tensor  # int64 [R, K + 1]: the rows of each request, padded with its last row
    first_rows: torch.Tensor  # int64 [R]: the first row of each request
    bias: tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # (rows, token ids, values) of logit_bias
    banned: tuple[torch.Tensor, torch.Tensor]  # (rows, token ids) set to -inf
    history_rows: torch.Tensor  # int64 [H]: rows whose sampled token extends a history
    new_seen: tuple[torch.Tensor, torch.Tensor]  # (history slots, token ids) of histories started this step
    new_counted: tuple[torch.Tensor, torch.Tensor]  # (history slots, token ids): their output ids


class RowBatch:
    """The host side of a step's rows: flags deciding which ops run, and the packing of
    :class:`DeviceRows`; ``history``: the history rows to fill before the step's edits read them."""

    def __init__(self, requests: list[SampleRequest], history: tuple[NewHistory, ...] = ()) -> None:
        self.requests, self.history = requests, history
        self.num_rows = sum(r.num_rows for r in requests)
        self.max_drafts = max((len(r.drafts) for r in requests), default=0)
        params = [r.params for r in requests]
        self.any_sampling = any(not p.greedy for p in params)
        self.any_top_k = any(p.top_k > 0 and not p.greedy for p in params)
        self.any_top_p = any(p.top_p < 1.0 and not p.greedy for p in params)
        self.any_min_p = any(p.min_p > 0.0 and not p.greedy for p in params)
        self.any_history = any(r.slot for r in requests)
        self.any_bias = any(p.logit_bias for p in params)
        self.any_banned = any(r.banned for r in requests)
        self.max_top_k = max((p.top_k for p in params if not p.greedy), default=0)
        self.max_logprobs = max((p.logprobs for p in params if p.logprobs is not None), default=-1)
        for r in requests:
            if r.drafts and (r.slot or r.params.logit_bias or r.banned):
                raise ValueError(f"request {r.seq_id}: drafts with logits edits (logit_bias, penalties, min_tokens) "
                                 "cannot be verified; the scheduler does not draft for such requests")

    def first_rows(self) -> list[int]:
        """The first row of each request."""
        out, row = [], 0
        for r in self.requests:
            out.append(row)
            row += r.num_rows
        return out

    def to_device(self, device: torch.device) -> DeviceRows:
        """Pack every host value into one float64 buffer, copy it once, and slice it on the device."""
        flat, sizes = self._pack()
        host = torch.tensor(flat, dtype=torch.float64)
        if device.type == "cuda":
            host = host.pin_memory()
        buf = host.to(device, non_blocking=True)
        parts = list(torch.split(buf, sizes))
        n = self.num_rows
        cols = parts[0].view(len(_COLS), n) if n else parts[0].view(len(_COLS), 0)
        col = dict(zip(_COLS, cols))
        ints = {k: col[k].to(torch.int64) for k in ("top_k", "seed_lo", "seed_hi", "position", "draft", "slot")}
        flt = {k: col[k].to(torch.float32) for k in ("temperature", "top_p", "min_p", "repetition", "frequency",
                                                     "presence")}
        request_rows = parts[1].to(torch.int64).view(len(self.requests), self.max_drafts + 1)
        bias = parts[2].view(3, -1)
        banned = parts[3].to(torch.int64).view(2, -1)
        return DeviceRows(**flt, **ints, seeded=col["seeded"] > 0, request_rows=request_rows,
                          first_rows=request_rows[:, 0],
                          bias=(bias[0].to(torch.int64), bias[1].to(torch.int64), bias[2].to(torch.float32)),
                          banned=(banned[0], banned[1]), history_rows=parts[4].to(torch.int64),
                          new_seen=_pairs(parts[5]), new_counted=_pairs(parts[6]))

    def _pack(self) -> tuple[list[float], list[int]]:
        columns: dict[str, list[float]] = {k: [] for k in _COLS}
        request_rows: list[int] = []
        bias: list[list[float]] = [[], [], []]
        banned: list[list[int]] = [[], []]
        history: list[int] = []
        for first, r in zip(self.first_rows(), self.requests):
            self._pack_request(r, columns)
            rows = list(range(first, first + r.num_rows))
            request_rows += rows + [rows[-1]] * (self.max_drafts + 1 - len(rows))
            for tok, b in r.params.logit_bias:
                bias[0].append(first), bias[1].append(tok), bias[2].append(b)
            for tok in r.banned:
                banned[0].append(first), banned[1].append(tok)
            if r.slot:
                history.append(first)
        flat = [v for k in _COLS for v in columns[k]]
        seen = [[h.slot for h in self.history for _ in h.seen], [t for h in self.history for t in h.seen]]
        counted = [[h.slot for h in self.history for _ in h.counted], [t for h in self.history for t in h.counted]]
        blocks = [flat, request_rows, bias[0] + bias[1] + bias[2], banned[0] + banned[1], history,
                  seen[0] + seen[1], counted[0] + counted[1]]
        return [v for b in blocks for v in b], [len(b) for b in blocks]

    @staticmethod
    def _pack_request(r: SampleRequest, columns: dict[str, list[float]]) -> None:
        p = r.params
        seed = 0 if p.seed is None else p.seed % (1 << 64)
        for i in range(r.num_rows):
            values = (p.temperature, p.top_k, p.top_p, p.min_p, p.repetition_penalty, p.frequency_penalty,
                      p.presence_penalty, seed & 0xFFFFFFFF, seed >> 32, float(p.seed is not None), r.position + i,
                      r.drafts[i] if i < len(r.drafts) else -1, r.slot)
            for k, v in zip(_COLS, values):
                columns[k].append(float(v))


def _pairs(part: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(first half, second half)`` of a packed block of two equal-length int lists, as int64."""
    both = part.to(torch.int64).view(2, -1)
    return both[0], both[1]
