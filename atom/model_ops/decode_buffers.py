"""Decode-step inputs in preallocated tensors of bucketed sizes: what a captured CUDA graph reads.

A captured graph replays fixed kernels on fixed addresses, so a decode step that replays one must put
its metadata into the same tensors every time, with shapes that depend only on the batch-size bucket.
:class:`DecodeBuffers` holds those tensors, sized once for the largest bucket, and
:meth:`DecodeBuffers.fill` writes a decode batch into the first rows, padded up to its bucket.

A step qualifies (:meth:`DecodeBuffers.bucket_for`) when every request decodes one token and at most
``drafts`` drafts (0: a plain decode step; speculative decoding: the MTP verify step, ``1 + drafts`` tokens of
which the first is committed), none is newly admitted (``state_reset``: its ring is cleared before use) or resumes from
a prefix hit (``restore_page``), and the batch fits the largest bucket. Its :class:`StepInputs` then fixes
every host value the forward reads (``max_pos`` = the step's context bucket - 1, ``max_len`` = ``1 +
drafts``, no reset, no restore) and every shape (``S = bucket``, ``T = S * (1 + drafts)``; entry lists of
``T // ratio + S`` entries; every row samples; with drafts, the committed rows are each request's first).
The context bucket (:func:`context_bucket`) is the longest context in the step rounded up
to a power of two (at least ``min_context``, at most ``max_model_len``): index widths
(:meth:`StepInputs.index_width`) follow the requests' lengths, so a short step at a 1M ``max_model_len``
scores as many indexer keys as it would at 4K, and a graph is captured per (batch bucket, context bucket).

A verify step's request with fewer than ``drafts`` drafts (near ``max_tokens`` or ``max_model_len``, drafts
the arena could not back, a request that decodes one token per step) is padded to ``1 + drafts`` rows: its
missing draft slots are padding tokens (token 0 at its last real position, on the padding row: nothing
written, nothing read), they complete no entry, and their rows are never sampled: :attr:`DecodeBuffers.kept`
lists the real rows, whose logits the sampler takes (so acceptance stops at the request's last real draft,
as unpadded). Every verify step of a speculative engine thus runs on the bucketed inputs.

Padding requests are inert: their tokens sit at positions ``0 ..`` in the page tables' padding row (every
page -1, never handed to a request, so ``swa_write`` and the capture skip them), their state slot is
-1 (the compressor state kernels skip them) and they complete no entry. Their attention reads
nothing, and every op outside attention is per token, so the real rows compute what they compute
without padding, up to the rounding of index lists widened with -1 entries.
"""

from __future__ import annotations

import torch

from atom.kernels._common import next_pow2
from atom.step_contract import ScheduledBatch
from atom.model_ops.step_inputs import EntryList, PageTables, RowSubset, StepInputs

__all__ = ["DecodeBuffers", "MIN_CONTEXT", "context_bucket", "decode_buckets"]

MIN_CONTEXT = 256  # the smallest context bucket: shorter steps share its widths


def context_bucket(longest: int, max_model_len: int, min_context: int = MIN_CONTEXT) -> int:
    """The context a decode step's widths are sized for: ``longest`` (its longest request's length,
    the decoded token included) rounded up to a power of two, at least ``min_context``, capped at
    ``max_model_len``."""
    if not 1 <= longest <= max_model_len:
        raise ValueError(f"a decode step's longest context must be in 1..max_model_len={max_model_len}, got {longest}")
    return min(next_pow2(max(longest, min_context)), max_model_len)


def decode_buckets(max_seqs: int) -> tuple[int, ...]:
    """Batch sizes a decode step is padded to: powers of two below ``max_seqs``, then ``max_seqs``."""
    if max_seqs < 1:
        raise ValueError(f"max_seqs must be >= 1, got {max_seqs}")
    sizes = [1 << i for i in range(max_seqs.bit_length()) if 1 << i < max_seqs]
    return tuple(sizes + [max_seqs])


class DecodeBuffers:
    """Persistent decode-step tensors for batches of up to ``max_seqs`` requests on ``device``."""

    def __init__(self, max_seqs: int, ratios: tuple[int, ...], max_model_len: int, padding_row: int,
                 device: str | torch.device = "cpu", drafts: int = 0) -> None:
        if drafts < 0:
            raise ValueError(f"drafts must be >= 0 (the drafts each request verifies), got {drafts}")
        self.sizes = decode_buckets(max_seqs)
        self.max_model_len, self.padding_row = max_model_len, padding_row
        self.ratios = tuple(sorted(set(ratios) - {0}))
        self.drafts = drafts
        q = self.per_seq = 1 + drafts  # tokens per request
        n = self.sizes[-1]

        def zeros(size: int, dtype: torch.dtype) -> torch.Tensor:
            return torch.zeros(size, dtype=dtype, device=device)

        self.token_ids, self.positions, self.token_slot = zeros(n * q, torch.long), zeros(n * q, torch.long), \
            zeros(n * q, torch.int32)
        self.pos_start, self.slots, self.rows = zeros(n, torch.int32), zeros(n, torch.int32), zeros(n, torch.int32)
        self.cu_seqlens = torch.arange(0, n * q + 1, q, dtype=torch.int32, device=device)  # q tokens per request
        self.reset = zeros(n, torch.bool)
        self.restore_src = torch.full((n,), -1, dtype=torch.int32, device=device)
        self.sample_rows = torch.arange(n * q, dtype=torch.long, device=device)
        # the rows of real tokens, in batch order (padded draft slots left out): the rows the sampler takes
        self.kept = torch.arange(n * q, dtype=torch.long, device=device)
        # verify steps: each request's first row is committed (the compressor state advances over it; the
        # accepted drafts' rows after verification)
        self.committed_rows = torch.arange(0, n * q, q, dtype=torch.long, device=device)
        self.committed_cu = torch.arange(n + 1, dtype=torch.int32, device=device)
        self.entry_seq = {r: zeros(n * q // r + n, torch.long) for r in self.ratios}
        self.entry_ids = {r: zeros(n * q // r + n, torch.long) for r in self.ratios}

    def bucket_for(self, batch: ScheduledBatch) -> int | None:
        """The bucket ``batch`` is padded to, or None when it is not a decode step of at most ``drafts``
        drafts per request that fits."""
        n = len(batch.seqs)
        if n == 0 or n > self.sizes[-1]:
            return None
        if any(s.num_tokens != 1 + s.num_draft or s.num_draft > self.drafts or not s.sample or s.state_reset
               or s.restore_page >= 0 for s in batch.seqs):
            return None
        return next(size for size in self.sizes if size >= n)

    def context_for(self, batch: ScheduledBatch) -> int:
        """The context bucket of decode ``batch`` (:func:`context_bucket` of its longest request, drafts
        included)."""
        return context_bucket(max(s.start_pos + s.num_tokens for s in batch.seqs), self.max_model_len)

    def padded_drafts(self, batch: ScheduledBatch) -> bool:
        """Whether a request of decode ``batch`` has fewer drafts than the buffers verify (its missing slots
        are padding, so the real rows are not the bucket's first: take them through :attr:`kept`)."""
        return any(s.num_tokens != self.per_seq for s in batch.seqs)

    def inputs(self, size: int, context: int | None = None) -> StepInputs:
        """A new :class:`StepInputs` of bucket ``size`` and context bucket ``context`` (default
        ``max_model_len``) over the buffers: views, the same addresses every time, contents whatever
        :meth:`fill` last wrote, and an empty ``derived`` cache (a captured graph owns the one it
        captured on, so the tensors derived from the buffers are computed inside the capture)."""
        context = self.max_model_len if context is None else context
        q = self.per_seq
        t = size * q
        entries = {r: EntryList(self.entry_seq[r][: t // r + size], self.entry_ids[r][: t // r + size])
                   for r in self.ratios}
        committed = None
        if self.drafts:
            committed = RowSubset(self.committed_rows[:size], self.committed_cu[: size + 1], self.pos_start[:size], 1)
        return StepInputs(
            token_ids=self.token_ids[:t], positions=self.positions[:t], token_slot=self.token_slot[:t],
            cu_seqlens=self.cu_seqlens[: size + 1], pos_start=self.pos_start[:size], slots=self.slots[:size],
            rows=self.rows[:size], reset=self.reset[:size], restore_src=self.restore_src[:size], entries=entries,
            sample_rows=self.sample_rows[:t], max_pos=context - 1, max_len=q, any_reset=False,
            any_restore=False, seq_ids=[], lengths=[q] * size, num_draft=[self.drafts] * size, committed=committed)

    def pad(self, size: int) -> None:
        """Make every row of bucket ``size`` a padding request (graph capture runs on these)."""
        self._write(size, [], [], [], [], [])

    def fill(self, batch: ScheduledBatch, tables: PageTables) -> StepInputs:
        """Write decode ``batch`` (``bucket_for`` not None; ``tables`` already updated by it) into the
        buffers, padded to its bucket; return that bucket's inputs."""
        size = self.bucket_for(batch)
        assert size is not None, "fill() takes decode steps of the buffers' drafts that fit the largest bucket"
        seqs = batch.seqs
        self._write(size, [t for s in seqs for t in s.token_ids], [s.num_tokens for s in seqs],
                    [s.start_pos for s in seqs], [tables.row_of[s.seq_id] for s in seqs], [s.state_slot for s in seqs])
        step = self.inputs(size, self.context_for(batch))
        step.seq_ids = [s.seq_id for s in seqs]
        return step

    def _write(self, size: int, tokens: list[int], counts: list[int], starts: list[int], rows: list[int],
               slots: list[int]) -> None:
        """Requests ``0 .. len(starts) - 1`` of ``counts`` tokens each (``tokens`` flat, at most ``per_seq``
        each, the missing draft slots padding at the request's last position on the padding row), first at
        ``starts``, on table ``rows`` and state ``slots``; the rest of bucket ``size`` padding."""
        q, pad = self.per_seq, size - len(starts)
        counts, starts, rows = counts + [0] * pad, starts + [0] * pad, rows + [self.padding_row] * pad
        flat, positions, token_rows, kept, lo = [], [], [], [], 0
        for s, (n, first, row) in enumerate(zip(counts, starts, rows)):
            flat += tokens[lo:lo + n] + [0] * (q - n)
            positions += [first + (j if j < n or n == 0 else n - 1) for j in range(q)]  # padding requests: 0 ..
            token_rows += [row] * n + [self.padding_row] * (q - n)
            kept += range(s * q, s * q + n)
            lo += n
        t = size * q
        host = torch.tensor([flat, positions, token_rows, kept + [0] * (t - len(kept))], dtype=torch.long)
        per_seq = torch.tensor([starts, rows, slots + [-1] * pad], dtype=torch.long)
        self.token_ids[:t].copy_(host[0], non_blocking=True)
        self.positions[:t].copy_(host[1], non_blocking=True)
        self.token_slot[:t].copy_(host[2], non_blocking=True)
        self.kept[:t].copy_(host[3], non_blocking=True)
        self.pos_start[:size].copy_(per_seq[0], non_blocking=True)
        self.rows[:size].copy_(per_seq[1], non_blocking=True)
        self.slots[:size].copy_(per_seq[2], non_blocking=True)
        for r in self.ratios:  # a request completes entry p // r when its position p is the entry's last
            done = [(s, p // r) for s, (first, n) in enumerate(zip(starts, counts)) for p in range(first, first + n)
                    if (p + 1) % r == 0]
            e = t // r + size
            ent = torch.tensor([[s for s, _ in done] + [-1] * (e - len(done)),
                                [i for _, i in done] + [0] * (e - len(done))], dtype=torch.long)
            self.entry_seq[r][:e].copy_(ent[0], non_blocking=True)
            self.entry_ids[r][:e].copy_(ent[1], non_blocking=True)
