"""Drafting with DeepSeek-V4's MTP layer over the paged arena.

The MTP block predicts token ``p + 2`` from the main model's final stream ``h_p`` and the embedding of
token ``p + 1`` (``dsv4_model.md``: its own sliding-window attention, ``e_proj`` / ``h_proj``, the
shared embedding and LM head). Its KV rows live in the arena like any layer's: the layout counts the
MTP layer (``kv_spec(include_mtp=True)``), so its SWA rows sit in the same chunks, are published
with the same blocks and come back with a prefix hit.

After every step (:meth:`MtpDrafter.run`), for each request:

1. the MTP layer runs over every position the step made part of the sequence (the committed rows and
   the accepted drafts) with the next token of each: the following row's token, and for the last
   one the token just sampled (or, for a prefill chunk that does not sample, the next prompt token,
   ``ScheduledSeq.lookahead``), so its KV rows are written for exactly the positions the main
   layers wrote;
2. for a request that sampled, its last row's MTP logits give the first draft (argmax), and the MTP
   layer is applied again ``K - 1`` times on its own output stream and the previous draft, one
   position further each time. Those extra rows are written past the sequence's computed length:
   the next step's pass (1) overwrites them before any query reads them.

Nothing is read back between the passes: each pass embeds the previous pass's argmax from the device,
and all the drafts of the step come back in one read after the last pass. Drafts are argmaxes, so they
are deterministic (the rejection sampler treats them as one-hot
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

    def run(self, batch: ScheduledBatch, step: StepInputs, tables: PageTables, hidden: torch.Tensor,
            out: RunnerOutput) -> dict[int, tuple[int, ...]]:
        """Write the MTP rows of the step's kept positions and return each sampling request's drafts.
        ``hidden [N, hc, dim]``: the main model's final stream of every row of the step. The drafts stay
        on the device from one MTP pass to the next (each pass embeds the previous pass's argmax) and
        come back to the host in one read at the end."""
        rows, next_ids, positions, slots, last = [], [], [], [], []
        lo = 0
        for item in batch.seqs:
            kept = item.num_committed + out.accepted.get(item.seq_id, 0)
            follow = out.sampled.get(item.seq_id, item.lookahead)  # a chunk that does not sample has a next token
            assert follow >= 0, f"request {item.seq_id}: no token follows its chunk"
            rows.extend(range(lo, lo + kept))
            next_ids.extend(item.token_ids[1:kept] + (follow,))
            positions.extend(range(item.start_pos, item.start_pos + kept))
            slots.extend([tables.row_of[item.seq_id]] * kept)
            if item.seq_id in out.sampled:
                last.append((item.seq_id, len(rows) - 1))
            lo += item.num_tokens
        dev = hidden.device
        head_rows = [r for _, r in last]
        rows_t, next_t, head_t = stage([rows, next_ids, head_rows], dev)  # one copy for the step's lists
        x, logits = self._forward(hidden[rows_t], next_t, positions, slots, step, tables, head_rows)
        base, seq_slots = [positions[r] for r in head_rows], [slots[r] for r in head_rows]
        drafting, tokens = list(range(len(last))), torch.argmax(logits, dim=-1)
        found = [(drafting, tokens)]  # (requests drafting at this depth, their tokens on the device)
        state = x[head_t]
        for depth in range(1, self.num_tokens):  # recursive drafts on the MTP layer's own stream
            keep = [j for j, i in enumerate(drafting) if base[i] + depth < self.max_model_len]
            if not keep:
                break
            sel = stage([keep], dev)[0]
            drafting = [drafting[j] for j in keep]
            state, logits = self._forward(state[sel], tokens[sel], [base[i] + depth for i in drafting],
                                          [seq_slots[i] for i in drafting], step, tables, list(range(len(keep))))
            tokens = torch.argmax(logits, dim=-1)
            found.append((drafting, tokens))
        values = torch.cat([t for _, t in found]).tolist()  # the drafts' one read-back
        drafts: dict[int, list[int]] = {sid: [] for sid, _ in last}
        k = 0
        for drafting, _ in found:
            for i in drafting:
                drafts[last[i][0]].append(values[k])
                k += 1
        return {sid: tuple(d) for sid, d in drafts.items()}

    def _forward(self, h: torch.Tensor, ids: torch.Tensor, positions: list[int], slots: list[int],
                 step: StepInputs, tables: PageTables, head_rows: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """The MTP block over rows ``h [T, hc, dim]`` (token ``ids[t]``, a device tensor, follows position
        ``positions[t]``): ``(its output stream [T, hc, dim], logits of head_rows)``."""
        pos_t, slots_t, head_t = stage([positions, slots, head_rows], h.device)  # one copy
        mtp_step = dataclasses.replace(step, token_ids=ids, positions=pos_t, token_slot=slots_t.to(torch.int32),
                                       committed=None)
        return self.model.mtp_forward(h, mtp_step, tables, head_t)
