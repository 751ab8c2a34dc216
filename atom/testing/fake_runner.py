"""A deterministic stand-in for the model runner, so the whole control plane runs without torch.

It is a real consumer of the scheduler's contract: it keeps the per-request page tables the way the
model runner does (full tables when a request is admitted, then deltas, dropped on release) and
returns a token that depends only on the request and the position, so runs are reproducible. It
verifies speculative drafts the way greedy decoding does: a step's drafts are accepted while each
equals the token the runner would have sampled at its position, so speculation never changes the
tokens, only how many a step yields. With a
:class:`KvContentModel` it also checks that every row a step reads holds what a cold run wrote.
"""

from __future__ import annotations

from atom.testing.kv_content_model import KvContentModel
from atom.step_contract import RunnerOutput, ScheduledBatch
from atom.kv.page_map import COMPRESS, SWA

__all__ = ["FakeRunner"]


class FakeRunner:
    """``token = (seq_id * 7919 + position * 31) % vocab_size``, skipping ``avoid`` tokens."""

    def __init__(self, vocab_size: int = 1000, avoid: tuple[int, ...] = (),
                 content: KvContentModel | None = None) -> None:
        self.vocab_size = vocab_size
        self.content = content
        self.avoid = set(avoid)
        self.tables: dict[int, dict[str, list[int]]] = {}
        self.steps = 0

    def token_for(self, seq_id: int, position: int) -> int:
        tok = (seq_id * 7919 + position * 31) % self.vocab_size
        while tok in self.avoid:
            tok = (tok + 1) % self.vocab_size
        return tok

    def execute(self, batch: ScheduledBatch) -> RunnerOutput:
        self.steps += 1
        for sid in batch.released_ids:
            self.tables.pop(sid, None)
        for new in batch.new_tables:
            self.tables[new.seq_id] = {COMPRESS: list(new.comp_pages), SWA: list(new.swa_pages)}
        for u in batch.table_updates:
            table = self.tables[u.seq_id][u.owner]
            end = u.index + len(u.pages)
            if len(table) < end:
                table += [-1] * (end - len(table))
            table[u.index:end] = u.pages
        if self.content is not None:
            self.content.step(batch, self.tables)
        sampled, accepted = {}, {}
        for s in batch.seqs:
            if not s.sample:
                continue
            pos = s.start_pos + s.num_committed  # the position of the first token this step decides
            n = 0
            for draft in s.drafts:  # greedy verification: a draft stands while it is the runner's token
                if draft != self.token_for(s.seq_id, pos):
                    break
                n, pos = n + 1, pos + 1
            sampled[s.seq_id] = self.token_for(s.seq_id, pos)
            if n:
                accepted[s.seq_id] = n
                if self.content is not None:
                    self.content.accept(s, n)
        return RunnerOutput(sampled, accepted=accepted)
