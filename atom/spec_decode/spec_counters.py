"""Speculative decoding counters: drafts proposed and accepted, acceptance length, per position."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["SpecCounters"]


@dataclass
class SpecCounters:
    """Totals over every verified step of every request (``max_drafts`` = K of the configuration).

    ``verifies``: request-steps that verified at least one draft; ``proposed`` / ``accepted``: drafts;
    ``accepted_at[i]``: how often draft ``i`` (0-based) was accepted (every earlier one was too);
    ``proposed_at[i]``: how often a step proposed a draft at position ``i``.
    """

    max_drafts: int
    verifies: int = 0
    proposed: int = 0
    accepted: int = 0
    proposed_at: list[int] = field(default_factory=list)
    accepted_at: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.proposed_at = [0] * self.max_drafts
        self.accepted_at = [0] * self.max_drafts

    def record(self, num_drafts: int, num_accepted: int) -> None:
        """One request's step verified ``num_drafts`` drafts and accepted the first ``num_accepted``."""
        assert 0 < num_drafts <= self.max_drafts and 0 <= num_accepted <= num_drafts
        self.verifies += 1
        self.proposed += num_drafts
        self.accepted += num_accepted
        for i in range(num_drafts):
            self.proposed_at[i] += 1
        for i in range(num_accepted):
            self.accepted_at[i] += 1

    @property
    def acceptance_rate(self) -> float:
        """Accepted / proposed drafts (0 before any draft)."""
        return self.accepted / self.proposed if self.proposed else 0.0

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens a verifying step yields on average: accepted drafts + the correction / bonus token."""
        return (self.accepted + self.verifies) / self.verifies if self.verifies else 0.0

    def position_acceptance(self) -> list[float]:
        """Per draft position: accepted / proposed there."""
        return [a / p if p else 0.0 for a, p in zip(self.accepted_at, self.proposed_at)]
