"""The one registry of ``ATOM_*`` environment variables.

Every variable the package reads is declared here with its type, default and a one-line doc, and is
read nowhere else (``tests/test_envs.py`` fails if any other module touches ``os.environ``). Values
are parsed once, by :func:`load`, into a frozen :class:`AtomEnv`; configuration code copies what it
needs into config fields at start-up, so no hot path and no model code ever looks at the environment.

A value that does not parse raises :class:`EnvError` naming the variable, the value and what is
accepted. An ``ATOM_*`` variable that is set but not registered is reported with a warning, because
a typo (``ATOM_SWA_FULL_RETIAN=1``) would otherwise silently do nothing.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field, fields
from typing import Callable, Mapping

__all__ = ["EnvError", "EnvVar", "REGISTRY", "AtomEnv", "load", "documentation", "child_environment"]


class EnvError(ValueError):
    """An ``ATOM_*`` variable holds a value that does not parse."""


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off", "")


def _parse_bool(name: str, raw: str) -> bool:
    low = raw.strip().lower()
    if low in _TRUE:
        return True
    if low in _FALSE:
        return False
    raise EnvError(f"{name}={raw!r} is not a boolean; accepted: {', '.join(_TRUE)} / {', '.join(repr(v) for v in _FALSE)}")


def _parse_nonneg_int(name: str, raw: str) -> int:
    try:
        value = int(raw.strip())
    except ValueError:
        raise EnvError(f"{name}={raw!r} is not an integer; accepted: a whole number >= 0") from None
    if value < 0:
        raise EnvError(f"{name}={raw!r} is negative; accepted: a whole number >= 0")
    return value


def _parse_fraction(name: str, raw: str) -> float:
    try:
        value = float(raw.strip())
    except ValueError:
        raise EnvError(f"{name}={raw!r} is not a number; accepted: a fraction in (0, 1]") from None
    if not 0.0 < value <= 1.0:
        raise EnvError(f"{name}={raw!r} is out of range; accepted: a fraction in (0, 1]")
    return value


def _choice(*choices: str) -> Callable[[str, str], str]:
    def parse(name: str, raw: str) -> str:
        value = raw.strip().lower()
        if value not in choices:
            raise EnvError(f"{name}={raw!r} is not accepted; accepted: {', '.join(choices)}")
        return value

    return parse


@dataclass(frozen=True)
class EnvVar:
    """One registered variable: ``attr`` is its field name in :class:`AtomEnv`."""

    name: str
    attr: str
    default: object
    doc: str
    parse: Callable[[str, str], object]


REGISTRY: dict[str, EnvVar] = {
    v.name: v
    for v in (
        EnvVar(
            "ATOM_SWA_FULL_RETAIN", "swa_full_retain", False,
            "bool: keep every published SWA block cached (LRU) after it leaves the window, so "
            "mid-sequence prefix hits become possible (default off: only blocks that came from the "
            "cache, the windows before the prompt boundary and a shared-prefix junction, and a "
            "finished request's tail stay cached). Every SWA row is written in both modes.",
            _parse_bool,
        ),
        EnvVar(
            "ATOM_SWA_RETENTION_INTERVAL", "swa_retention_interval", 0,
            "int tokens: with full retain, pin SWA checkpoint blocks every N tokens and at the prompt "
            "boundary (0 = no pins; must be a multiple of the block size).",
            _parse_nonneg_int,
        ),
        EnvVar(
            "ATOM_SWA_PIN_FRACTION", "swa_pin_fraction", 0.25,
            "float in (0, 1]: the most of the arena's chunks that retention pins may hold; the least "
            "recently used pin is released past it.",
            _parse_fraction,
        ),
        EnvVar(
            "ATOM_KERNEL_BACKEND", "kernel_backend", "auto",
            "auto|torch|triton|aiter: which kernel implementation runs (auto: aiter on ROCm, Triton on "
            "a GPU, the torch reference on CPU).",
            _choice("auto", "torch", "triton", "aiter"),
        ),
        EnvVar(
            "ATOM_CACHE_DIR", "cache_dir", "",
            "path: where the built-in tiny model is written on first use (default: ~/.cache/atom).",
            lambda name, raw: raw.strip(),
        ),
        EnvVar(
            "ATOM_DEBUG_NAN_ARENA", "debug_nan_arena", False,
            "bool: fill the KV arena with NaN at start-up so any read of unwritten memory shows.",
            _parse_bool,
        ),
        EnvVar(
            "ATOM_API_KEY", "api_key", "",
            "string: the key `atom serve` requires as `Authorization: Bearer KEY` when `--api-key` is not "
            "given (kept out of the process list; empty = no key).",
            lambda name, raw: raw.strip(),
        ),
    )
}


@dataclass(frozen=True)
class AtomEnv:
    """The parsed values of every registered variable (defaults where unset)."""

    swa_full_retain: bool = False
    swa_retention_interval: int = 0
    swa_pin_fraction: float = 0.25
    kernel_backend: str = "auto"
    cache_dir: str = ""
    debug_nan_arena: bool = False
    api_key: str = field(default="", repr=False)  # a secret: never in a repr or a log


def load(environ: Mapping[str, str] | None = None) -> AtomEnv:
    """Parse the registered variables from ``environ`` (the process environment if None).

    Raises :class:`EnvError` on the first value that does not parse.
    """
    env = os.environ if environ is None else environ
    values = {}
    for var in REGISTRY.values():
        raw = env.get(var.name)
        values[var.attr] = var.default if raw is None else var.parse(var.name, raw)
    unknown = sorted(k for k in env if k.startswith("ATOM_") and k not in REGISTRY)
    if unknown:
        warnings.warn(
            f"unknown ATOM_* environment variables are ignored: {', '.join(unknown)}; "
            f"known: {', '.join(REGISTRY)}",
            stacklevel=2,
        )
    return AtomEnv(**values)


def child_environment(drop: tuple[str, ...] = ()) -> dict[str, str]:
    """A copy of this process's environment without the variables in ``drop``, for a child process
    that must not inherit them (the GPU check runs its steps without ``TRITON_INTERPRET``)."""
    return {k: v for k, v in os.environ.items() if k not in drop}


def documentation() -> str:
    """A Markdown table of every variable, for ``docs/configuration.md`` and ``atom serve --help``."""
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    rows += [f"| `{v.name}` | `{v.default}` | {v.doc} |" for v in REGISTRY.values()]
    return "\n".join(rows)


def _check_registry_matches_fields() -> None:
    attrs = {v.attr: v.default for v in REGISTRY.values()}
    declared = {f.name: f.default for f in fields(AtomEnv)}
    assert attrs == declared, f"REGISTRY and AtomEnv disagree: {attrs} vs {declared}"


_check_registry_matches_fields()
