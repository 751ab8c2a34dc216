"""Drafting with DeepSeek-V4's MTP layer over the paged arena.

The MTP block predicts token ``p + 2`` from the main model's final stream ``h_p`` and the embedding of
token ``p + 1`` (``dsv4_model.md``: its own sliding-window attention, ``e_proj`` / ``h_proj``, the
shared embedding and LM head). Its KV rows live in the arena like any layer's: the layout counts the
MTP layer (``kv_spec(include_mtp=True)``), so its SWA rows sit in the same chunks, are published
with the same blocks and come back with a prefix hit.

After every step, for each request (:meth:`MtpDrafter.propose`, on the device, before the step's one
read-back; :meth:`MtpDrafter.drafts` sorts the values that read brings back):

1. the MTP layer runs over every row of the step (the step's own positions and table rows), each with
   the token that follows it: the next row's token, and for the last kept row of a request that
   sampled (its last committed row plus the accepted drafts, an index computed on the device from the
   accepted count) the token just sampled; for a prefill chunk that does not sample, the next prompt
   token (``ScheduledSeq.lookahead``). So its KV rows are written for exactly the rows the main layers
   wrote; those of rejected drafts hold a rejected token, like the main layers' rows, and are
   rewritten by the step that computes their positions before any query reads them (a query reads
   only positions up to its own);
2. for a request that sampled, its last kept row's MTP logits give the first draft (argmax), and the
   MTP layer is applied again ``K - 1`` times on its own output stream and the previous draft, one
   position further each time. Those extra rows are written past the sequence's computed length: the
   next step's pass (1) overwrites them before any query reads them. A position at or past
   ``max_model_len`` is run as padding (position 0 in the page tables' padding row, whose pages are
   all -1: nothing written, nothing read) and its draft is dropped on the host.

Nothing is read back between the passes, and nothing crosses in but the step's per-row next tokens and
each sampling request's first candidate row (one staged copy): the sampled tokens and accepted counts
stay on the device, and all the drafts of the step come back with the sampled tokens in the sampler's
one read. Drafts are argmaxes, so they are deterministic (the rejection sampler treats them as one-hot
proposals). What they are never changes the output, only how many tokens a step yields.
"""

from __future__ import annotations

import dataclasses

import torch

from atom.step_contract import RunnerOutput, ScheduledBatch
from atom.model_ops.host_staging import stage
from atom.model_ops.step_inputs import PageTables, StepInputs
from atom.models.deepseek_v4_serving import DeepseekV4ForServing

__all__ = ["MtpDrafter"]


class MtpDrafter:
    """Runs the serving model's MTP block (bound to the arena with the model) and proposes ``num_tokens``
    drafts per sampling request."""

    def __init__(self, model: DeepseekV4ForServing, num_tokens: int, max_model_len: int) -> None:
        if not model.mtp:
            raise ValueError("speculative decoding drafts with the MTP layer, but this checkpoint has none "
                             "(num_nextn_predict_layers = 0)")
        self.model = model
        self.num_tokens, self.max_model_len = num_tokens, max_model_len

    def propose(self, batch: ScheduledBatch, step: StepInputs, tables: PageTables, hidden: torch.Tensor,
                tokens: torch.Tensor, accepted: torch.Tensor) -> torch.Tensor:
        """Write the MTP rows of the step and draft on the device: int64 ``[num_tokens, R]``, row ``d`` the
        ``d``-th draft of each of the ``R`` sampling requests (batch order). ``hidden [N, hc, dim]``: the
        main model's final stream of every row of the step (of a bucketed verify step: the real requests'
        rows, each request's padded draft slots after its own, then the padding requests'; the MTP layer runs
        every padding row as padding too); ``tokens`` / ``accepted`` (int64
        ``[R]``, on the device): each sampling request's sampled token and accepted draft count."""
        next_ids, firsts, lo = [], [], 0
        for item, rows in zip(batch.seqs, step.lengths):
            if not item.sample:
                assert item.lookahead >= 0, f"request {item.seq_id}: no token follows its chunk"
            next_ids.extend(item.token_ids[1:] + (item.lookahead if not item.sample else 0,))
            next_ids.extend([0] * (rows - item.num_tokens))  # a bucketed verify step's padded draft slots
            if item.sample:
                firsts.append(lo + item.num_committed - 1)  # its last kept row, before accepted drafts
            lo += rows
        next_ids.extend([0] * (hidden.shape[0] - lo))  # a bucketed step's padding rows (nothing written)
        dev = hidden.device
        next_t, first_t = stage([next_ids, firsts], dev)  # one copy for the step's lists
        head_t = first_t + accepted
        next_t = next_t.index_put((head_t,), tokens)  # the sampled token follows the last kept row
        x, logits = self._forward(hidden, next_t, step.positions, step.token_slot, step, tables, head_t)
        found = [torch.argmax(logits, dim=-1)]
        base, slots, state = step.positions[head_t], step.token_slot[head_t], x[head_t]
        rows = torch.arange(len(firsts), device=dev)
        for depth in range(1, self.num_tokens if firsts else 1):  # recursive drafts on the MTP layer's stream
            pos = base + depth
            inside = pos < self.max_model_len  # past it: a padding row (nothing written or read), draft dropped
            pos = torch.where(inside, pos, torch.zeros_like(pos))
            slot = torch.where(inside, slots, torch.full_like(slots, tables.padding_row))
            state, logits = self._forward(state, found[-1], pos, slot, step, tables, rows)
            found.append(torch.argmax(logits, dim=-1))
        return torch.stack(found) if firsts else first_t.new_zeros((0, 0))

    def drafts(self, batch: ScheduledBatch, out: RunnerOutput, values: tuple[int, ...]) -> dict[int, tuple[int, ...]]:
        """Each sampling request's drafts from ``values`` (:meth:`propose`'s result as read back, flattened),
        cut where a draft's position would reach ``max_model_len``."""
        items = [item for item in batch.seqs if item.sample]
        width = len(items)
        drafts = {}
        for i, item in enumerate(items):
            last = item.start_pos + item.num_committed - 1 + out.accepted.get(item.seq_id, 0)
            n = min(self.num_tokens, self.max_model_len - last)
            drafts[item.seq_id] = tuple(values[d * width + i] for d in range(n))
        return drafts

    def _forward(self, h: torch.Tensor, ids: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor,
                 step: StepInputs, tables: PageTables, head_rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The MTP block over rows ``h [T, hc, dim]`` (token ``ids[t]`` follows position ``positions[t]`` of
        table row ``slots[t]``, all on the device): ``(its output stream [T, hc, dim], logits of head_rows)``."""
        mtp_step = dataclasses.replace(step, token_ids=ids, positions=positions, token_slot=slots.to(torch.int32),
                                       committed=None)
        return self.model.mtp_forward(h, mtp_step, tables, head_rows)
