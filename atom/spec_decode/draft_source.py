"""Where speculative decoding's proposed tokens come from: pluggable draft sources.

The scheduler asks its draft source for up to ``k`` tokens to follow a decoding request; the runner
verifies them against the target model in the same forward, so what a source proposes changes only
how many tokens a step yields, never which ones (greedy) or their distribution (sampling).

- :class:`RunnerDrafts`: the drafts the runner's draft model (DeepSeek-V4's MTP layer) proposed
  after the request's last step (``RunnerOutput.drafts``); the serving default.
- test oracles (``atom.testing.replay_draft.ReplayDraft``) implement the same protocol.

Pure Python: part of the control plane.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["DraftRequest", "DraftSource", "RunnerDrafts"]


class DraftRequest(Protocol):
    """What a draft source reads of a request (the step loop's ``Sequence``, seen structurally, so
    speculative decoding imports nothing of the step loop)."""

    seq_id: int
    token_ids: list[int]
    num_prompt_tokens: int

    def __len__(self) -> int: ...

    @property
    def num_output_tokens(self) -> int: ...

    @property
    def output_token_ids(self) -> list[int]: ...


class DraftSource(Protocol):
    def propose(self, seq: DraftRequest, k: int) -> tuple[int, ...]:
        """Up to ``k`` tokens to follow ``seq``'s tokens (fewer or none when it has no proposal)."""
        ...

    def observe(self, seq: DraftRequest, drafts: tuple[int, ...]) -> None:
        """The runner proposed ``drafts`` to follow ``seq``'s tokens after its latest step."""
        ...

    def forget(self, seq_id: int) -> None:
        """``seq_id`` finished, was aborted or preempted: drop what is kept for it."""
        ...


class RunnerDrafts:
    """The runner's own drafts (``RunnerOutput.drafts``), valid for the sequence length they followed."""

    def __init__(self) -> None:
        self._drafts: dict[int, tuple[int, tuple[int, ...]]] = {}

    def propose(self, seq: DraftRequest, k: int) -> tuple[int, ...]:
        length, drafts = self._drafts.get(seq.seq_id, (-1, ()))
        return drafts[:k] if length == len(seq) else ()

    def observe(self, seq: DraftRequest, drafts: tuple[int, ...]) -> None:
        self._drafts[seq.seq_id] = (len(seq), tuple(drafts))

    def forget(self, seq_id: int) -> None:
        self._drafts.pop(seq_id, None)
