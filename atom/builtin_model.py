"""The built-in tiny DeepSeek-V4 model that ``atom serve`` runs when no model directory is given.

It is a seeded random, unquantized checkpoint in the real release format (``config.json`` +
safetensors + the byte-level tokenizer of :mod:`atom.tokenizer`, all written by
:func:`atom.models.deepseek_v4.make_tiny_checkpoint.make_tiny_checkpoint`), written once to
``<cache>/tiny-dsv4-v1`` where ``<cache>`` is the ``cache_dir`` argument, else ``ATOM_CACHE_DIR``,
else ``~/.cache/atom``.

Writing is atomic: files go to a private temporary folder beside the target, a completion marker
is written last, and the folder is renamed into place. A target that holds the marker is reused as
is; concurrent first runs (several test workers, two servers) all end up with one complete copy.
The name carries a version (``-v1``): change it whenever the weights or tokenizer would change.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

__all__ = ["BUILTIN_MODEL_NAME", "BUILTIN_DIR_NAME", "ensure_builtin_model", "default_cache_dir"]

#: The name the server reports for the built-in model (``/v1/models``).
BUILTIN_MODEL_NAME = "atom-tiny-dsv4"
#: Folder name inside the cache directory; bump the version when the content changes.
BUILTIN_DIR_NAME = "tiny-dsv4-v1"
_MARKER = ".atom-complete"
_SEED = 0


def default_cache_dir() -> Path:
    """``ATOM_CACHE_DIR`` if set (parsed by :mod:`atom.envs`), else ``~/.cache/atom``."""
    from atom import envs

    configured = envs.load().cache_dir
    return Path(configured).expanduser() if configured else Path.home() / ".cache" / "atom"


def _is_complete(path: Path) -> bool:
    return (path / _MARKER).is_file() and (path / "config.json").is_file() and (path / "tokenizer.json").is_file()


def _write(tmp: Path) -> None:
    from atom.models.deepseek_v4.make_tiny_checkpoint import make_tiny_checkpoint

    make_tiny_checkpoint(tmp, seed=_SEED)  # weights, config.json and the tokenizer
    (tmp / _MARKER).write_text(f"{BUILTIN_DIR_NAME} seed={_SEED}\n")


def ensure_builtin_model(cache_dir: str | Path | None = None) -> Path:
    """Return the directory of the built-in tiny model, writing it first if it is not there yet.

    Raises ``ValueError`` when the cache directory cannot be created or written (naming it and
    how to choose another: ``ATOM_CACHE_DIR``).
    """
    root = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    target = root / BUILTIN_DIR_NAME
    if _is_complete(target):
        return target
    try:
        root.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{BUILTIN_DIR_NAME}-tmp-", dir=root))
    except OSError as exc:
        raise ValueError(f"cannot write the built-in model under {root}: {exc}; set ATOM_CACHE_DIR "
                         "to a writable folder") from None
    start = time.perf_counter()
    print(f"atom: writing the built-in tiny DeepSeek-V4 model to {target} (first run only)",
          file=sys.stderr, flush=True)
    try:
        _write(tmp)
        _move_into_place(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"atom: built-in model ready in {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    return target


def _move_into_place(tmp: Path, target: Path) -> None:
    """Rename ``tmp`` to ``target``; if another process won the race with a complete copy, keep it.

    An incomplete ``target`` (left by something other than this function) is moved aside and
    removed first.
    """
    for _ in range(3):
        try:
            os.rename(tmp, target)
            return
        except OSError:
            if _is_complete(target):
                return
            if target.exists():
                trash = target.with_name(f".{target.name}-stale-{uuid.uuid4().hex[:8]}")
                try:
                    os.rename(target, trash)
                except OSError:
                    continue
                shutil.rmtree(trash, ignore_errors=True)
    raise ValueError(f"could not move the built-in model into {target}; remove that folder and retry")
