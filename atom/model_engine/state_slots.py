"""The live compressor-state slots: one per admitted request, budgeted by the KV layout.

A slot is handed out *clean*: the scheduler marks the request's first step ``state_reset`` so the
runner clears it (kv 0, score -inf) before use. ATOM's slots kept the previous owner's rows, which
leaked into a resumed request's first compression.
"""

from __future__ import annotations

from atom.validation import require_int
__all__ = ["StateSlotPool"]


class StateSlotPool:
    """Free slot ids, lowest first."""

    def __init__(self, num_slots: int) -> None:
        require_int("num_slots", num_slots, 1)
        self.num_slots = num_slots
        self._free = list(range(num_slots - 1, -1, -1))
        self._used: set[int] = set()

    def num_free(self) -> int:
        return len(self._free)

    def take(self) -> int:
        if not self._free:
            raise RuntimeError("no free compressor-state slot; admission must check num_free() first")
        slot = self._free.pop()
        self._used.add(slot)
        return slot

    def give_back(self, slot: int) -> None:
        if slot not in self._used:
            raise RuntimeError(f"state slot {slot} returned but not in use")
        self._used.remove(slot)
        self._free.append(slot)

    def check_integrity(self, held: list[int]) -> None:
        assert sorted(held) == sorted(self._used), f"slots held {sorted(held)} vs used {sorted(self._used)}"
        assert len(self._free) + len(self._used) == self.num_slots
