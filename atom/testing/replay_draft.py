"""A draft source that replays an earlier run: an oracle for the speculative-decoding machinery.

It replays the outputs of an earlier run of the same prompts (every draft right under greedy
decoding), or, with ``shift``, those tokens plus ``shift`` modulo the vocabulary (a draft that is
always wrong). Both drive the verify / rollback machinery end to end in tests and benchmarks, where
random tiny weights make a real draft model's acceptance meaningless.
"""

from __future__ import annotations

from typing import Mapping, Sequence as Seq

from atom.spec_decode.draft_source import DraftRequest

__all__ = ["ReplayDraft"]


class ReplayDraft:
    """Proposes the tokens an earlier run generated after the same prompt (``outputs``: prompt ids ->
    output ids), each plus ``shift`` modulo ``vocab_size``. A request whose output left the recorded
    one, or whose prompt is unknown, gets no proposal."""

    def __init__(self, outputs: Mapping[tuple[int, ...], Seq[int]], shift: int = 0, vocab_size: int = 0) -> None:
        if shift and vocab_size <= shift:
            raise ValueError(f"a shifted replay needs vocab_size > shift, got vocab_size={vocab_size}, shift={shift}")
        self._outputs = {tuple(p): tuple(o) for p, o in outputs.items()}
        self.shift, self.vocab_size = shift, vocab_size

    def propose(self, seq: DraftRequest, k: int) -> tuple[int, ...]:
        ref = self._outputs.get(tuple(seq.token_ids[: seq.num_prompt_tokens]))
        done = seq.num_output_tokens
        if ref is None or tuple(seq.output_token_ids) != ref[:done]:
            return ()
        tokens = ref[done:done + k]
        return tuple((t + self.shift) % self.vocab_size for t in tokens) if self.shift else tokens

    def observe(self, seq: DraftRequest, drafts: tuple[int, ...]) -> None:
        return None

    def forget(self, seq_id: int) -> None:
        return None
