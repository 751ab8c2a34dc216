"""The interpreter patching that the slow Triton engine tests use (``support.interpreter_patching``) makes the
interpreter's own changes: on every object ``_patch_lang`` patches, the same attributes get wrappers of the same
builtins, whether the object is first listed unpatched or already wrapped; and a kernel calling ``@triton.jit``
functions gives the same bits with it."""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
from triton.language import core
from triton.runtime import interpreter

from support.interpreter_patching import cached_interpreter_patching, names_cached_patch_builtin  # noqa: F401

PATCHED = (tl, tl.core, tl.core.tensor, tl.math, tl.core.tensor_descriptor_base)


def patches(patch_builtin, pkg) -> list[tuple[str, object]]:
    """``(name, builtin wrapped)`` of each change ``patch_builtin`` makes to ``pkg``, the changes undone after."""
    scope = interpreter._LangPatchScope()
    patch_builtin(pkg, interpreter.interpreter_builder, scope)
    made = [(name, getattr(pkg, name).__kwdefaults__["member"]) for _, name, _ in scope._changes]
    originals = [original for _, _, original in scope._changes]
    scope.restore()
    assert originals == [member for _, member in made]  # each wrapper wraps what it replaced
    return made


def unwrapped(pkg) -> interpreter._LangPatchScope:
    """Undo wrappers a kernel's inner calls left on ``pkg`` (they are never restored); the returned scope puts
    them back."""
    scope = interpreter._LangPatchScope()
    for name in dir(pkg):
        defaults = getattr(getattr(pkg, name, None), "__kwdefaults__", None)
        if isinstance(defaults, dict) and core.is_builtin(defaults.get("member")):
            scope.set_attr(pkg, name, defaults["member"])
    return scope


def test_the_interpreter_still_has_the_patch_functions_the_cache_wraps():
    assert callable(interpreter._patch_builtin) and callable(interpreter._patch_attr)
    assert interpreter._patch_lang.__globals__ is interpreter._patch_builtin.__globals__


@pytest.mark.parametrize("pkg", PATCHED, ids=lambda p: getattr(p, "__name__", str(p)))
def test_the_cached_patcher_wraps_the_builtins_the_interpreter_wraps_on_every_call(pkg):
    put_back = unwrapped(pkg)
    try:
        want = patches(interpreter._patch_builtin, pkg)
        cached = names_cached_patch_builtin(interpreter._patch_builtin, core.is_builtin)
        assert len(want) > 0
        assert patches(cached, pkg) == want  # first call: lists the object
        assert patches(cached, pkg) == want  # later calls: by name
    finally:
        put_back.restore()


@pytest.mark.parametrize("pkg", PATCHED, ids=lambda p: getattr(p, "__name__", str(p)))
def test_an_object_first_listed_while_wrapped_is_patched_as_the_interpreter_patches_it(pkg):
    put_back = unwrapped(pkg)
    try:
        want = patches(interpreter._patch_builtin, pkg)
        outer = interpreter._LangPatchScope()
        interpreter._patch_builtin(pkg, interpreter.interpreter_builder, outer)
        cached = names_cached_patch_builtin(interpreter._patch_builtin, core.is_builtin)
        assert patches(cached, pkg) == []  # everything already wrapped: nothing to do, as for the interpreter
        assert patches(interpreter._patch_builtin, pkg) == []
        outer.restore()
        assert patches(cached, pkg) == want
    finally:
        put_back.restore()


@triton.jit
def _softmax_rows_kernel(x_ptr, y_ptr, N: tl.constexpr):
    row = tl.program_id(0)
    x = tl.load(x_ptr + row * N + tl.arange(0, N))
    e = tl.exp(x - tl.max(x, axis=0))
    tl.store(y_ptr + row * N + tl.arange(0, N), tl.sigmoid(e / tl.sum(e, axis=0)))


def softmax_sigmoid(x: torch.Tensor) -> torch.Tensor:
    y = torch.empty_like(x)
    _softmax_rows_kernel[(x.shape[0],)](x, y, N=x.shape[1])
    return y


def test_a_kernel_with_inner_jit_calls_gives_the_same_bits_with_the_cached_patcher(request, gen):
    x = torch.randn(5, 16, generator=gen)
    want = softmax_sigmoid(x)
    request.getfixturevalue("cached_interpreter_patching")
    got = softmax_sigmoid(x)
    assert torch.equal(got, want)
    torch.testing.assert_close(want, torch.sigmoid(torch.softmax(x, dim=1)))  # and it is the kernel it means to be
