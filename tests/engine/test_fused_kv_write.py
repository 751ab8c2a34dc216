"""The serving attention's fused K=V row write (``rope_kv_write``): taken on the Triton backend, where it gives the
engine's logits and arena bytes of the unfused path (the ``kv_norm`` and rope kernels, the round trip,
``swa_write``) bit for bit with two launches fewer per layer; never taken on the torch backend, whose engine stays
the reference's ops."""

import pytest
import torch

from atom.models.deepseek_v4_serving.attention import ArenaAttention
from support.counted_runs import counted_greedy_run
from support.interpreter_patching import cached_interpreter_patching  # noqa: F401  (a fixture)
from support.runtime_warnings import FAIL_ON_RUNTIME_WARNINGS
from support.shallow_model import make_shallow_engine, shallow_dir  # noqa: F401  (fixtures)

pytestmark = FAIL_ON_RUNTIME_WARNINGS

PROMPT = [(29 * i + 7) % 500 + 1 for i in range(20)]  # crosses the tiny model's 16-token block


def attention_layers(engine) -> list[ArenaAttention]:
    return [m for m in engine.runner.model.modules() if isinstance(m, ArenaAttention)]


def test_the_torch_backend_keeps_the_unfused_write_and_the_triton_backend_fuses_it(make_engine):
    assert not any(a.fuse_kv_write for a in attention_layers(make_engine(backend="torch")))
    assert all(a.fuse_kv_write for a in attention_layers(make_engine(backend="triton")))


@pytest.mark.slow
@pytest.mark.usefixtures("cached_interpreter_patching")
@pytest.mark.parametrize("rows,quant_sim", [("fp32", False), ("fp8", True)], ids=["fp32-rows", "fp8-rows-quant-sim"])
def test_on_triton_the_fused_write_gives_the_unfused_paths_logits_and_arena_bytes(make_shallow_engine, rows,
                                                                                  quant_sim):
    fused = make_shallow_engine(backend="triton", kv_cache_dtype=rows, quant_sim=quant_sim, budget=24)
    unfused = make_shallow_engine(backend="triton", kv_cache_dtype=rows, quant_sim=quant_sim, budget=24)
    for layer in attention_layers(unfused):
        layer.fuse_kv_write = False  # the path before the fusion: kv_norm and rope kernels, round trip, swa_write
    tokens, logits, count, steps = counted_greedy_run(fused, PROMPT, 2)
    want_tokens, want_logits, want_count, want_steps = counted_greedy_run(unfused, PROMPT, 2)
    assert tokens == want_tokens and steps == want_steps and len(logits) == len(want_logits) > 0
    assert all(torch.equal(a, b) for a, b in zip(logits, want_logits))
    assert torch.equal(fused.runner.views.buffer, unfused.runner.views.buffer)
    assert want_count.triton - count.triton == 2 * steps * len(attention_layers(fused))
