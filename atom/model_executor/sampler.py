"""Sampling a step's tokens on the device, batched: greedy, temperature, top-k, min-p, top-p, logits edits,
logprobs and the verification of drafts, in one fixed set of ops and one read-back.

Every request of a step is a group of rows (:mod:`sampling_rows`): one row, or ``k + 1`` for ``k``
drafts. The ops run over all rows at once, each with its own parameters, and which ops run depends
only on which features the batch uses (any top-k, any top-p, ...), never on a row's values:

1. logits edits (:mod:`logits_processors`, batched): ``logit_bias``, penalties from the history
   tables, ``min_tokens`` bans;
2. greedy rows: the argmax; sampling rows: temperature, then the filters of :func:`filtered_probs`;
3. random draws from a counter-based generator (:mod:`counter_rng`): row keys from the request's
   ``(seed, output position)``, so a seeded request's tokens do not depend on the batch it runs in,
   on what ran before, or on a preemption (its positions are recomputed the same). Requests without a
   seed draw their keys from the engine's generator. A token is drawn by the exponential race
   ``argmax(p / E)`` with ``E = -log(u)`` per vocabulary entry (distributed exactly as ``p``; no
   ``multinomial``, no normalisation needed);
4. drafts (:mod:`atom.spec_decode.rejection_sampler`, batched): accepted while they equal the argmax
   (greedy) or pass the rejection test; the token after the last accepted draft is the target's
   (greedy) or drawn from the residual;
5. the step's outputs (tokens, accepted counts, logprobs, and the values of device work given to run
   on the sampled tokens first: the MTP drafts) are packed into one float64 tensor and read back once
   (pinned, non-blocking, waited on by an event on a GPU).

The random stream changed with this design: before it, a seeded request drew from a
``torch.Generator`` seeded per position (``torch.multinomial``); the same seed now gives other (equally
distributed) tokens than before, and the same tokens in any batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable

import torch

from atom.model_executor.counter_rng import MASK32, row_keys, uniforms
from atom.model_executor.logits_processors import apply_batched_edits, token_logprobs
from atom.model_executor.sampling_rows import DeviceRows, NewHistory, RowBatch, SampleRequest
from atom.output.request_output import TokenLogprobs
from atom.sampling_params import SamplingParams
from atom.spec_decode.rejection_sampler import accept_drafts

__all__ = ["Sampler", "StepSamples", "filtered_probs"]


@dataclass(frozen=True)
class StepSamples:
    """Per request of the step, in order: the token it emits, how many of its drafts were accepted, and
    the logprobs it asked for (None when it did not, or when it verified drafts); ``extra``: the values of
    the ``after`` work :meth:`Sampler.sample_all` was given, read back with them."""

    tokens: list[int]
    accepted: list[int]
    logprobs: list[TokenLogprobs | None]
    extra: tuple[int, ...] = ()


def filtered_probs(z: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor,
                   batch: RowBatch) -> torch.Tensor:
    """The distributions tokens are drawn from, per row of ``z [N, vocab]`` (logits divided by the
    temperature): restricted to the ``top_k`` largest (0 = off), then to the tokens at least ``min_p``
    times as likely as the most likely one, then to the smallest most-likely set whose mass reaches
    ``top_p``; renormalised after each filter. Only the filters some row uses run (``batch`` flags)."""
    if batch.any_top_k:
        kmax = min(batch.max_top_k, z.shape[-1])
        top = torch.topk(z, kmax, dim=-1).values
        kth = top.gather(-1, (top_k.clamp(1, kmax) - 1).unsqueeze(-1))
        kth = torch.where((top_k > 0).unsqueeze(-1), kth, torch.full_like(kth, float("-inf")))
        z = z.masked_fill(z < kth, float("-inf"))
    probs = torch.softmax(z, dim=-1)
    if batch.any_min_p:
        floor = min_p.unsqueeze(-1) * probs.amax(dim=-1, keepdim=True)
        probs = torch.where(probs >= floor, probs, torch.zeros_like(probs))
        probs = probs / probs.sum(dim=-1, keepdim=True)
    if batch.any_top_p:
        sorted_p, order = torch.sort(probs, dim=-1, descending=True)
        keep = torch.cumsum(sorted_p, dim=-1) - sorted_p < top_p.unsqueeze(-1)  # keeps the most likely token
        keep = keep | (top_p >= 1.0).unsqueeze(-1)  # top_p = 1: every token, whatever the cumsum's rounding
        mask = torch.empty_like(keep).scatter_(-1, order, keep)  # back to vocabulary order, no host read
        probs = torch.where(mask, probs, torch.zeros_like(probs))
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


class Sampler:
    """``eos_token_id``: the token ``min_tokens`` forbids (with ``stop_token_ids``) until reached.
    Samples on the logits' device; the engine's generator (keys of unseeded requests) lives on ``device``.

    Penalty history: one row per request that needs it (:meth:`begin`) in two device tables
    (``counts [S, vocab]`` int32 generated counts, ``seen [S, vocab]`` bool prompt or output), row 0
    all zero for requests without history; the sampled tokens update them on the device."""

    def __init__(self, seed: int = 0, eos_token_id: int | None = None, device: str | torch.device = "cpu") -> None:
        self.device = torch.device(device)
        self._shared = torch.Generator(device=self.device).manual_seed(seed)
        self._eos = eos_token_id
        self._slot: dict[int, int] = {}  # seq_id -> history row
        self._generated: dict[int, int] = {}  # seq_id -> tokens generated (for min_tokens)
        self._free: list[int] = []
        self._pending: dict[int, NewHistory] = {}  # history rows begun, their ids not yet on the device
        self._counts: torch.Tensor | None = None
        self._seen: torch.Tensor | None = None

    # ---- per-request history ------------------------------------------------------------------
    def begin(self, seq_id: int, prompt: tuple[int, ...], output: tuple[int, ...], vocab: int,
              device: torch.device) -> None:
        """A request (re)admitted with penalties or min_tokens: its history from its ids so far. The row is
        cleared now (device fills); the ids cross with the next :meth:`sample_all`'s packed rows (no copy of
        their own) and are written there before any edit reads the row."""
        slot = self._slot.get(seq_id) or self._take_slot(vocab, device)
        self._slot[seq_id], self._generated[seq_id] = slot, len(output)
        self._counts[slot].zero_()
        self._seen[slot].zero_()
        self._pending[slot] = NewHistory(slot, prompt + output, output)

    def release(self, seq_ids: Iterable[int]) -> None:
        for sid in seq_ids:
            slot = self._slot.pop(sid, None)
            self._generated.pop(sid, None)
            if slot:
                self._pending.pop(slot, None)
                self._free.append(slot)

    def _take_slot(self, vocab: int, device: torch.device) -> int:
        if self._free:
            return self._free.pop()
        used = 1 + len(self._slot)
        if self._counts is None or used >= self._counts.shape[0]:
            rows = max(8, 2 * used)
            counts = torch.zeros(rows, vocab, dtype=torch.int32, device=device)
            seen = torch.zeros(rows, vocab, dtype=torch.bool, device=device)
            if self._counts is not None:
                counts[:self._counts.shape[0]] = self._counts
                seen[:self._seen.shape[0]] = self._seen
            self._counts, self._seen = counts, seen
        return used

    # ---- the step -----------------------------------------------------------------------------
    def request(self, seq_id: int, params: SamplingParams, position: int, drafts: tuple[int, ...] = ()
                ) -> SampleRequest:
        """The :class:`SampleRequest` of ``seq_id`` sampling at output ``position`` (its history row and
        the tokens ``min_tokens`` bans now filled in)."""
        slot = self._slot.get(seq_id, 0)
        banned = ()
        if slot and self._generated[seq_id] < params.min_tokens:
            banned = tuple(params.stop_token_ids) + (() if self._eos is None else (self._eos,))
        return SampleRequest(seq_id, params, position, drafts, slot, banned)

    def sample_all(self, logits: torch.Tensor, requests: list[SampleRequest],
                   after: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None) -> StepSamples:
        """Tokens for the step: ``logits [N, vocab]`` hold each request's rows in order (see
        :class:`SampleRequest`). One host-to-device copy in, one read back. ``after(tokens, accepted)``:
        device work on the step's outcome (int64 ``[R]`` each, request order; empty when nothing samples),
        launched before the read; its integer result (a shape the host knows) comes back in the same read,
        as :attr:`StepSamples.extra` (the MTP drafts, which need the sampled tokens)."""
        if not requests:
            if after is not None:
                none = torch.zeros(0, dtype=torch.long, device=logits.device)
                assert after(none, none).numel() == 0, "work after a step that samples nothing returned values"
            return StepSamples([], [], [])
        batch, rows = self.rows(requests, logits.device)
        assert logits.shape[0] == batch.num_rows, f"{logits.shape[0]} logits rows for {batch.num_rows} sampling rows"
        edited = apply_batched_edits(logits, rows, batch, self._counts, self._seen)
        greedy = torch.argmax(edited, dim=-1)
        probs = noise = None
        if batch.any_sampling:
            temp = torch.where(rows.temperature > 0, rows.temperature, torch.ones_like(rows.temperature))
            probs = filtered_probs(edited / temp.unsqueeze(-1), rows.top_k, rows.top_p, rows.min_p, batch)
            noise = uniforms(self._keys(rows), logits.shape[-1] + 1)
        accepted, tokens = accept_drafts(greedy, probs, noise, rows, batch.max_drafts)
        if batch.any_history:
            self._extend_history(rows, tokens, batch)
        extra = None if after is None else after(tokens, accepted)
        return self._read(logits, tokens, accepted, rows, batch, extra)

    def rows(self, requests: list[SampleRequest], device: torch.device) -> tuple[RowBatch, DeviceRows]:
        """The step's rows on ``device`` (one copy), with the history rows begun since the last step written
        into the history tables (their ids travel in the same copy)."""
        batch = RowBatch(requests, tuple(self._pending.values()))
        rows = batch.to_device(device)
        if batch.history:
            self._pending.clear()
            self._fill_history(rows)
        return batch, rows

    def _fill_history(self, rows: DeviceRows) -> None:
        """Write the ids of new history rows (already cleared by :meth:`begin`)."""
        slots, ids = rows.new_seen
        self._seen.index_put_((slots, ids), torch.ones_like(ids, dtype=torch.bool))
        slots, ids = rows.new_counted
        self._counts.index_put_((slots, ids), torch.ones_like(ids, dtype=torch.int32), accumulate=True)

    def _keys(self, rows: DeviceRows) -> torch.Tensor:
        seeded = row_keys(rows.seed_lo, rows.seed_hi, rows.position)
        drawn = torch.randint(0, MASK32 + 1, seeded.shape, generator=self._shared, device=self.device,
                              dtype=torch.int64).to(seeded.device)
        return torch.where(rows.seeded, seeded, drawn)

    def _extend_history(self, rows: DeviceRows, tokens: torch.Tensor, batch: RowBatch) -> None:
        """Count each request's new token in its history row (requests with history have no drafts, so
        a request's token sits at its first row)."""
        per_row = torch.zeros(batch.num_rows, dtype=torch.long, device=tokens.device).index_copy_(0, rows.first_rows,
                                                                                                  tokens)
        slots, toks = rows.slot[rows.history_rows], per_row[rows.history_rows]
        self._counts.index_put_((slots, toks), torch.ones_like(toks, dtype=torch.int32), accumulate=True)
        self._seen.index_put_((slots, toks), torch.ones_like(toks, dtype=torch.bool))
        for r in batch.requests:
            if r.slot:
                self._generated[r.seq_id] += 1

    def _read(self, logits: torch.Tensor, tokens: torch.Tensor, accepted: torch.Tensor, rows: DeviceRows,
              batch: RowBatch, extra: torch.Tensor | None) -> StepSamples:
        """Pack ``extra``, tokens, accepted counts and logprobs into one float64 tensor (exact for all of
        them: ids, counts and fp32 values) and read it back once."""
        extra = torch.zeros(0, dtype=torch.long, device=tokens.device) if extra is None else extra.flatten()
        parts = [extra.to(torch.float64), tokens.to(torch.float64), accepted.to(torch.float64)]
        top = max(batch.max_logprobs, 0)
        if batch.max_logprobs >= 0:
            logp = torch.log_softmax(logits[rows.first_rows].float(), dim=-1)
            parts.append(logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1).to(torch.float64))
            if top:
                values, ids = torch.topk(logp, min(top, logp.shape[-1]), dim=-1)
                parts += [ids.to(torch.float64).flatten(), values.to(torch.float64).flatten()]
        host = _to_host(torch.cat(parts))
        e, r = extra.numel(), len(batch.requests)
        values, host = tuple(int(v) for v in host[:e]), host[e:]
        toks, acc = [int(v) for v in host[:r]], [int(v) for v in host[r:2 * r]]
        return StepSamples(toks, acc, self._logprobs(host[2 * r:], toks, batch, top), values)

    @staticmethod
    def _logprobs(host: list[float], tokens: list[int], batch: RowBatch, top: int) -> list[TokenLogprobs | None]:
        if batch.max_logprobs < 0:
            return [None] * len(tokens)
        r = len(tokens)
        width = (len(host) - r) // (2 * r)  # top ids and values per request (min(top, vocab))
        chosen, ids, vals = host[:r], host[r:r + r * width], host[r + r * width:]
        out: list[TokenLogprobs | None] = []
        for i, req in enumerate(batch.requests):
            k = req.params.logprobs
            if k is None or req.drafts:
                out.append(None)
                continue
            alts = tuple((int(ids[i * width + j]), vals[i * width + j]) for j in range(min(k, width)))
            out.append(TokenLogprobs(tokens[i], chosen[i], alts))
        return out

    # ---- one request at a time (tests and tools) ------------------------------------------------
    def sample(self, logits: torch.Tensor, params: SamplingParams, position: int, seq_id: int | None = None) -> int:
        """One token from ``logits [vocab]`` for output ``position`` of request ``seq_id`` (a batch of one)."""
        req = self.request(-1 if seq_id is None else seq_id, params, position)
        return self.sample_all(logits.unsqueeze(0), [req]).tokens[0]

    def verify(self, logits: torch.Tensor, drafts: tuple[int, ...], params: SamplingParams, position: int
               ) -> tuple[int, int]:
        """``(accepted, token)`` for ``k`` drafts: ``logits [k + 1, vocab]`` from the last committed token on."""
        out = self.sample_all(logits, [SampleRequest(-1, params, position, tuple(drafts))])
        return out.accepted[0], out.tokens[0]

    @staticmethod
    def logprobs(logits: torch.Tensor, params: SamplingParams, token: int) -> TokenLogprobs | None:
        """The log-probabilities ``params.logprobs`` asks for of one row (None when it does not)."""
        if params.logprobs is None:
            return None
        chosen, top = token_logprobs(logits, token, params.logprobs)
        return TokenLogprobs(token, chosen, top)

    @staticmethod
    def filtered_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
        """:func:`filtered_probs` of one row ``logits [vocab]`` (already divided by the temperature)."""
        batch = RowBatch([SampleRequest(-1, params, 0)])
        rows = batch.to_device(logits.device)
        return filtered_probs(logits.float().unsqueeze(0), rows.top_k, rows.top_p, rows.min_p, batch)[0]


def _to_host(values: torch.Tensor) -> list[float]:
    """The step's one read-back: on a GPU a non-blocking copy into pinned memory, waited on by an event."""
    if values.device.type != "cuda":
        return values.tolist()
    host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
    host.copy_(values, non_blocking=True)
    done = torch.cuda.Event()
    done.record()
    done.synchronize()
    return host.tolist()
