"""The Triton interpreter's language patching without its rescans: the same patches, found by name.

Under ``TRITON_INTERPRET=1`` every launch, and every call of a ``@triton.jit`` function from inside a kernel
(``tl.sum``, ``tl.max``, ``tl.sigmoid``, the project's own device helpers), runs the interpreter's
``_patch_lang``: for each of ``triton.language``, ``triton.language.core``, ``tensor``, ``math`` and the tensor
descriptor base it lists every attribute with ``inspect.getmembers`` and wraps those that are Triton builtins.
The set of builtin names never changes, yet one case of the fused K=V write test on the six-layer tiny model
made about 40 000 of these calls, and that model's prefill of a 20-token prompt and one decode step on the
Triton backend took 10.6 s with the listings and 6.5 s without them (one idle core).

:func:`names_cached_patch_builtin` lists each object once and, on every later call, looks its builtin names up
directly; what it patches is decided as before, by ``is_builtin`` on the attribute as it stands, so the same
attributes get the same wrappers recorded in the same scope. A name is cached when its attribute is a builtin or
the interpreter's wrapper of one (the inner calls' patches are never restored, so an object may already be
wrapped when first listed). The names this misses, those ``_patch_lang_core`` had replaced with its own
functions when the object was first listed, are ones ``_patch_lang`` sets again right after the builtins, so
their value during a launch is the same. The kernels, their arguments and their results are untouched.

``tests/kernels/test_interpreter_patching.py`` checks that the cached patcher records the interpreter's own
changes, on a fresh process's objects and on already patched ones.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator

import pytest


def _is_wrapped_builtin(member: object, is_builtin: Callable[[object], bool]) -> bool:
    """Whether ``member`` is the interpreter's wrapper of a builtin (``lambda *args, member=builtin, ...``)."""
    defaults = getattr(member, "__kwdefaults__", None)
    return isinstance(defaults, dict) and is_builtin(defaults.get("member"))


def names_cached_patch_builtin(original: Callable, is_builtin: Callable[[object], bool]) -> Callable:
    """A drop-in ``_patch_builtin(pkg, builder, scope)`` that lists ``pkg`` once per object, then patches by name
    the attributes that are builtins at call time, through the interpreter's ``_patch_attr``."""
    names: dict[int, tuple[object, tuple[str, ...]]] = {}
    patch_attr = original.__globals__["_patch_attr"]

    def patch_builtin(pkg, builder, scope) -> None:
        entry = names.get(id(pkg))
        if entry is None or entry[0] is not pkg:
            found = tuple(name for name, member in inspect.getmembers(pkg)
                          if is_builtin(member) or _is_wrapped_builtin(member, is_builtin))
            entry = names[id(pkg)] = (pkg, found)
        for name in entry[1]:
            member = getattr(pkg, name)
            if is_builtin(member):
                patch_attr(pkg, name, member, builder, scope)

    return patch_builtin


@pytest.fixture
def cached_interpreter_patching(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """For one test: the interpreter's ``_patch_builtin`` replaced by :func:`names_cached_patch_builtin`. Only the
    test's own process: an engine test that runs its ranks in other processes keeps the interpreter as shipped."""
    from triton.language import core
    from triton.runtime import interpreter

    if hasattr(interpreter, "_patch_builtin") and hasattr(interpreter, "_patch_attr"):
        # without them (another Triton) the interpreter runs as shipped: slower, same results; the
        # test_interpreter_patching module fails then, naming what is missing
        monkeypatch.setattr(interpreter, "_patch_builtin",
                            names_cached_patch_builtin(interpreter._patch_builtin, core.is_builtin))
    yield
