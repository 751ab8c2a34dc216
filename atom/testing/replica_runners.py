"""D in-process runners stepped together: the data-parallel runner's contract without processes.

:class:`ReplicaRunners` gives :class:`~atom.model_engine.dp_engine.DataParallelEngine` the
``execute_all`` of :class:`atom.parallel.dp_runner.DataParallelRunner` over D ordinary runners (a
:class:`~atom.testing.fake_runner.FakeRunner` per replica in control-plane tests), so the control plane
of data-parallel attention runs in milliseconds. A replica given ``None`` runs a padding step: its
runner is not called (it touches no KV page), and the step and its one token are counted, as the
real runner counts them.
"""

from __future__ import annotations

from typing import Protocol, Sequence

from atom.model_engine.dp_engine import PADDING_TOKENS_PER_STEP
from atom.step_contract import RunnerOutput, ScheduledBatch

__all__ = ["ReplicaRunners"]


class _Runner(Protocol):
    def execute(self, batch: ScheduledBatch) -> RunnerOutput: ...


class ReplicaRunners:
    """``execute_all`` over ``runners`` (replica ``d`` is ``runners[d]``), counting padding."""

    def __init__(self, runners: Sequence[_Runner]) -> None:
        if not runners:
            raise ValueError("ReplicaRunners needs at least one runner")
        self.runners = list(runners)
        self.replicas = len(self.runners)
        self.padding_steps = 0
        self.padding_tokens = 0
        self.calls = 0

    def execute_all(self, batches: Sequence[ScheduledBatch | None]) -> list[RunnerOutput | None]:
        """Each replica's output for its batch (``None`` for a padding replica). ``ValueError`` when the
        number of batches is not the number of replicas or every batch is ``None`` (nothing to run: the
        engine makes no call then)."""
        if len(batches) != self.replicas:
            raise ValueError(f"{len(batches)} batches for {self.replicas} replicas")
        if all(b is None for b in batches):
            raise ValueError("execute_all needs at least one batch that is not None")
        self.calls += 1
        outs: list[RunnerOutput | None] = []
        for runner, batch in zip(self.runners, batches):
            if batch is None:
                self.padding_steps += 1
                self.padding_tokens += PADDING_TOKENS_PER_STEP
                outs.append(None)
            else:
                outs.append(runner.execute(batch))
        return outs

    def close(self) -> None:
        """Nothing to stop (in-process runners); for the same shutdown path as the real runner."""
