"""The serving attention's compressor fusions: on every backend the state kernels add ``ape`` (the projections leave
it out); on the Triton backend each compressor's ``wkv`` and ``wgate`` run as one GEMM, which gives the two GEMMs'
tokens with one ``mm`` fewer per compressor and step; the torch backend keeps the reference's two GEMMs."""

import pytest
import torch

from atom.models.deepseek_v4.compressor import Compressor
from support.counted_runs import counted_greedy_run
from support.interpreter_patching import cached_interpreter_patching  # noqa: F401  (a fixture)
from support.runtime_warnings import FAIL_ON_RUNTIME_WARNINGS
from support.shallow_model import make_shallow_engine, shallow_dir  # noqa: F401  (fixtures)

pytestmark = FAIL_ON_RUNTIME_WARNINGS

PROMPT = [(31 * i + 5) % 500 + 1 for i in range(21)]  # crosses the tiny model's 16-token block and its HCA block


def compressors(engine) -> list[Compressor]:
    return [m for m in engine.runner.model.modules() if isinstance(m, Compressor)]


def test_every_backend_adds_ape_in_the_kernels_and_only_triton_merges_the_compressor_gemms(make_engine):
    on_torch = compressors(make_engine(backend="torch"))
    on_triton = compressors(make_engine(backend="triton"))
    assert len(on_torch) == len(on_triton) > 0
    assert all(c.kernels_add_ape and c.kv_gate is None for c in on_torch)
    assert all(c.kernels_add_ape and c.kv_gate is not None for c in on_triton)


@pytest.mark.slow
@pytest.mark.usefixtures("cached_interpreter_patching")
def test_on_triton_the_merged_gemm_gives_the_two_gemms_tokens_with_one_mm_fewer_per_compressor(make_shallow_engine):
    merged = make_shallow_engine(backend="triton", budget=24)
    separate = make_shallow_engine(backend="triton", budget=24)
    for comp in compressors(separate):
        comp.bind_fused_gemm(False)
    tokens, logits, count, steps = counted_greedy_run(merged, PROMPT, 3)
    want_tokens, want_logits, want_count, want_steps = counted_greedy_run(separate, PROMPT, 3)
    assert tokens == want_tokens and steps == want_steps and len(logits) == len(want_logits) > 0
    for got, want in zip(logits, want_logits):  # the same fp32 products; a wider GEMM may sum in another order
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert want_count.aten["mm"] - count.aten["mm"] == steps * len(compressors(merged))
    assert want_count.triton == count.triton
