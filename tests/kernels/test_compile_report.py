"""The offline compile report: every variant compiles for sm90 and gfx942, its last line agrees with its table,
and the acceptance holds (no spill; tensor cores and 2 blocks per SM / CU for attention, indexer, GEMMs, MoE).

The report must run without the interpreter, so it runs in a subprocess whose environment lacks
``TRITON_INTERPRET`` (this directory's conftest sets it for the interpreter tests).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from atom.kernels.compile_report import HW_FAMILIES, MODELS, Geometry, variants
from atom.kernels.compile_stats import FP32_OPERANDS, HW_TARGETS, LOW_PRECISION

ROW = re.compile(r"^(\S+)\s+(\S+)\s+(.{9}) (.*\]) +(\d+) +(\S+) +(\d+) +(\d+) +(\d+)/(\d+) +(\d+)  (.*)$")
LAST = re.compile(r"^spill_bytes_max=(\d+) no_tensor_core=(\d+) smem_over=(\d+)$")


def _run_report(targets: str) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-m", "atom.kernels.compile_report", "--targets", targets],
                          capture_output=True, text=True, env=env, timeout=1800)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout.strip().splitlines()


def _mma(text: str) -> dict[str, int]:
    kinds = text.split(";")[0].strip()
    return {} if kinds == "none" else {k: int(n) for k, n in (p.split(":") for p in kinds.split(", "))}


@pytest.mark.slow
def test_every_variant_compiles_for_sm90_and_gfx942_without_spills_on_tensor_cores_at_two_blocks_per_sm():
    lines = _run_report("sm90,gfx942")
    rows = [ROW.match(line) for line in lines[1:-1]]
    assert all(rows), [line for line, m in zip(lines[1:-1], rows) if not m]
    expected = {(t, m, v.name) for t in ("sm90", "gfx942") for m in MODELS for v in variants(Geometry.from_preset(m))}
    compiled = {(r[1], r[2], r[4].rsplit(" [", 1)[0]) for r in rows}
    assert compiled == expected
    spill = no_tc = over = 0
    for r in rows:
        target, family, mma = HW_TARGETS[r[1]], r[3].strip(), _mma(r[12])
        smem, limit, occ = int(r[9]), int(r[10]), int(r[11])
        assert limit == target.smem_limit
        spill = max(spill, int(r[7]))
        hw_kernel = family in HW_FAMILIES
        low = sum(mma.get(k, 0) for k in LOW_PRECISION)
        no_tc += hw_kernel and (low == 0 or any(mma.get(k, 0) for k in FP32_OPERANDS))
        over += smem > limit or (hw_kernel and occ < 2)
    last = LAST.match(lines[-1])
    assert last, lines[-1]
    assert (int(last[1]), int(last[2]), int(last[3])) == (spill, no_tc, over)
    # the acceptance: no spill anywhere; attention, indexer, GEMM and MoE on bf16 / fp8 tensor cores with
    # room for 2 blocks per SM / CU
    assert (spill, no_tc, over) == (0, 0, 0)


@pytest.mark.slow  # a fresh interpreter importing torch and triton
def test_the_report_refuses_an_unknown_target_naming_the_accepted_ones():
    done = subprocess.run([sys.executable, "-m", "atom.kernels.compile_report", "--targets", "sm90,gfx1200"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "gfx1200" in done.stderr and "sm90, gfx942, gfx950" in done.stderr


def test_the_geometry_is_read_from_the_published_configs():
    flash, pro = Geometry.from_preset("flash"), Geometry.from_preset("pro")
    assert (flash.heads, flash.head_dim, flash.rope_dim, flash.index_heads, flash.index_topk) == (64, 512, 64, 64, 512)
    assert (pro.heads, pro.index_topk, pro.hidden, pro.moe_inter) == (128, 1024, 7168, 3072)
    assert flash.row_codec.row_bytes == 584 and flash.key_codec.row_bytes == 132


@pytest.mark.parametrize("model,preset", [("flash", "deepseek_v4_flash"), ("pro", "deepseek_v4_pro")])
def test_the_report_sizes_copied_pages_with_the_model_configs_kv_spec(model, preset):
    from atom.kernels.compile_report import kv_spec_of
    from atom.models.deepseek_v4.config import DeepseekV4Config

    assert kv_spec_of(model) == DeepseekV4Config.from_preset(preset).kv_spec()
