"""The one integer check used at every boundary (configs, layout sizing, arena primitives, requests).

Kept apart from :mod:`atom.config` so that low-level modules (the arena primitives, sampling
parameters) can use it without importing the config objects.
"""

from __future__ import annotations

from typing import Any

__all__ = ["require_int"]


def require_int(name: str, value: Any, minimum: int, maximum: int | None = None, note: str = "") -> int:
    """Return ``value`` when it is an ``int`` (``bool`` is not) in ``[minimum, maximum]``.

    Otherwise raise ``ValueError`` naming the field, the value and the accepted range, e.g.
    ``"max_tokens=0 must be an integer >= 1"``; ``note`` (e.g. ``"0 = choose"``) is appended in
    parentheses.
    """
    ok = not isinstance(value, bool) and isinstance(value, int) and value >= minimum
    if ok and maximum is not None:
        ok = value <= maximum
    if not ok:
        accepted = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        raise ValueError(f"{name}={value!r} must be an integer {accepted}" + (f" ({note})" if note else ""))
    return value
