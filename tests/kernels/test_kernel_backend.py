"""The backend registry: one place chooses; overrides and ATOM_KERNEL_BACKEND force a choice."""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from atom.kernels import backend
from atom.kernels.swa_write import swa_write, swa_write_ref

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(torch.cuda.is_available() or backend.aiter_available(),
                    reason="this machine has a GPU or aiter, so auto does not pick the torch reference")
def test_auto_picks_the_torch_reference_on_a_cpu_machine_without_aiter(monkeypatch):
    monkeypatch.delenv("ATOM_KERNEL_BACKEND", raising=False)
    assert backend.resolve_backend() == "torch"
    assert backend.resolve_backend("auto") == "torch"


def test_the_environment_variable_forces_triton(monkeypatch):
    monkeypatch.setenv("ATOM_KERNEL_BACKEND", "triton")
    assert backend.resolve_backend() == "triton"
    assert backend.get_kernel("swa_write") is swa_write


def test_an_explicit_override_wins_over_the_environment(monkeypatch):
    monkeypatch.setenv("ATOM_KERNEL_BACKEND", "triton")
    assert backend.get_kernel("swa_write", "torch") is swa_write_ref


@pytest.mark.skipif(backend.aiter_available(), reason="aiter imports on this machine")
def test_forcing_aiter_without_rocm_is_a_clear_error():
    with pytest.raises(ValueError, match="aiter"):
        backend.resolve_backend("aiter")


def test_an_unknown_backend_or_op_is_rejected():
    with pytest.raises(ValueError, match="cuda"):
        backend.resolve_backend("cuda")
    with pytest.raises(ValueError, match="no_such_op"):
        backend.get_kernel("no_such_op", "torch")


@pytest.mark.parametrize("name", ["torch", "triton"])
def test_load_kernels_binds_every_op_to_the_forced_backend(name):
    kernels = backend.load_kernels(name)
    assert kernels.backend == name
    assert set(kernels.ops) == set(backend.OPS)
    assert set(kernels.sources.values()) == {name}
    for op, (module, triton_name, ref_name) in backend.OPS.items():
        assert getattr(kernels, op).__name__ == (ref_name if name == "torch" else triton_name)


def test_an_aiter_registration_is_checked_against_the_known_ops():
    with pytest.raises(ValueError, match="unknown kernel op"):
        backend.register_aiter("not_an_op", lambda: None)


def test_kernel_modules_import_and_references_run_without_triton():
    script = textwrap.dedent("""
        import sys
        sys.modules["triton"] = None  # import triton now raises ImportError
        import torch
        from atom.kernels import backend
        from atom.kernels.swa_write import swa_write, swa_write_ref
        rows = torch.full((16, 2), float("nan"))
        table = torch.tensor([[1]], dtype=torch.int32)
        one = torch.zeros(1, dtype=torch.int32)
        swa_write_ref(torch.ones(1, 2), rows, table, one, one, block_size=8, row_stride=8)
        assert rows[8].tolist() == [1.0, 1.0]
        assert backend.resolve_backend("auto") == "torch"
        for op in backend.OPS:
            backend.get_kernel(op, "torch")
        try:
            swa_write(torch.ones(1, 2), rows, table, one, one, block_size=8, row_stride=8)
        except RuntimeError as exc:
            assert "triton is not installed" in str(exc)
        else:
            raise AssertionError("the Triton wrapper ran without triton")
        print("ok")
    """)
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "ok"


def test_value_checks_off_skips_only_the_value_checks_and_does_not_nest():
    from support.kernels import i32

    rows = torch.full((16, 2), float("nan"))
    bad_table = i32([[5]])  # page 5 of an 8-row stride: outside the 16 rows
    with pytest.raises(ValueError, match="swa_table"):
        swa_write(torch.ones(1, 2), rows, bad_table, i32([0]), i32([0]), block_size=8, row_stride=8)
    with backend.value_checks_off():
        with pytest.raises(ValueError, match="dtype"):  # layout checks still run
            swa_write(torch.ones(1, 2, dtype=torch.float64), rows, i32([[1]]), i32([0]), i32([0]), block_size=8,
                      row_stride=8)
        swa_write(torch.ones(1, 2), rows, i32([[1]]), i32([0]), i32([0]), block_size=8, row_stride=8)
        with pytest.raises(RuntimeError, match="nest"):
            with backend.value_checks_off():
                pass
    assert rows[8].tolist() == [1.0, 1.0]
    with pytest.raises(ValueError, match="swa_table"):  # back on after the block
        swa_write(torch.ones(1, 2), rows, bad_table, i32([0]), i32([0]), block_size=8, row_stride=8)
