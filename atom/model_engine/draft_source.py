"""Where speculative decoding's proposed tokens come from: pluggable draft sources.

The scheduler asks its draft source for up to ``k`` tokens to follow a decoding request; the runner
verifies them against the target model in the same forward, so what a source proposes changes only
how many tokens a step yields, never which ones (greedy) or their distribution (sampling).

- :class:`RunnerDrafts`: the drafts the runner's draft model (DeepSeek-V4's MTP layer) proposed
  after the request's last step (``RunnerOutput.drafts``); the serving default.
- :class:`ReplayDraft`: replays the outputs of an earlier run of the same prompts (an oracle: every
  draft right under greedy decoding), or, with ``shift``, those tokens plus ``shift`` modulo the
  vocabulary (a draft that is always wrong). Both drive the verify / rollback machinery end to end
  in tests, where random tiny weights make a real draft model's acceptance meaningless.

Pure Python: part of the control plane.
"""

from __future__ import annotations

from typing import Mapping, Protocol, Sequence as Seq

from atom.model_engine.sequence import Sequence

__all__ = ["DraftSource", "RunnerDrafts", "ReplayDraft"]


class DraftSource(Protocol):
    def propose(self, seq: Sequence, k: int) -> tuple[int, ...]:
        """Up to ``k`` tokens to follow ``seq``'s tokens (fewer or none when it has no proposal)."""
        ...

    def observe(self, seq: Sequence, drafts: tuple[int, ...]) -> None:
        """The runner proposed ``drafts`` to follow ``seq``'s tokens after its latest step."""
        ...

    def forget(self, seq_id: int) -> None:
        """``seq_id`` finished, was aborted or preempted: drop what is kept for it."""
        ...


class RunnerDrafts:
    """The runner's own drafts (``RunnerOutput.drafts``), valid for the sequence length they followed."""

    def __init__(self) -> None:
        self._drafts: dict[int, tuple[int, tuple[int, ...]]] = {}

    def propose(self, seq: Sequence, k: int) -> tuple[int, ...]:
        length, drafts = self._drafts.get(seq.seq_id, (-1, ()))
        return drafts[:k] if length == len(seq) else ()

    def observe(self, seq: Sequence, drafts: tuple[int, ...]) -> None:
        self._drafts[seq.seq_id] = (len(seq), tuple(drafts))

    def forget(self, seq_id: int) -> None:
        self._drafts.pop(seq_id, None)


class ReplayDraft:
    """Proposes the tokens an earlier run generated after the same prompt (``outputs``: prompt ids ->
    output ids), each plus ``shift`` modulo ``vocab_size``. A request whose output left the recorded
    one, or whose prompt is unknown, gets no proposal."""

    def __init__(self, outputs: Mapping[tuple[int, ...], Seq[int]], shift: int = 0, vocab_size: int = 0) -> None:
        if shift and vocab_size <= shift:
            raise ValueError(f"a shifted replay needs vocab_size > shift, got vocab_size={vocab_size}, shift={shift}")
        self._outputs = {tuple(p): tuple(o) for p, o in outputs.items()}
        self.shift, self.vocab_size = shift, vocab_size

    def propose(self, seq: Sequence, k: int) -> tuple[int, ...]:
        ref = self._outputs.get(tuple(seq.token_ids[: seq.num_prompt_tokens]))
        done = seq.num_output_tokens
        if ref is None or tuple(seq.output_token_ids) != ref[:done]:
            return ()
        tokens = ref[done:done + k]
        return tuple((t + self.shift) % self.vocab_size for t in tokens) if self.shift else tokens

    def observe(self, seq: Sequence, drafts: tuple[int, ...]) -> None:
        return None

    def forget(self, seq_id: int) -> None:
        return None
