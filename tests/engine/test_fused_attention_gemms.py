"""The serving attention binds its fused GEMMs (merged wq_a / wkv and wq_b pairs, wo_a into wo_b's rows) on the Triton
backend only; the torch backend keeps the reference's GEMMs, as the CPU engine is compared with it value for value."""

from atom.models.deepseek_v4_serving.attention import ArenaAttention
from support.runtime_warnings import FAIL_ON_RUNTIME_WARNINGS

pytestmark = FAIL_ON_RUNTIME_WARNINGS


def attention_layers(engine) -> list[ArenaAttention]:
    return [m for m in engine.runner.model.modules() if isinstance(m, ArenaAttention)]


def test_the_triton_backend_merges_the_attention_gemms_and_the_torch_backend_does_not(make_engine):
    on_torch = attention_layers(make_engine(backend="torch"))
    assert all(a.in_proj is None and a.q_proj is None and not a.wo_a_into_rows for a in on_torch)
    on_triton = attention_layers(make_engine(backend="triton"))
    assert all(a.in_proj.merged is not None and a.wo_a_into_rows for a in on_triton)
    assert all(a.q_proj.merged is not None for a in on_triton if a.indexer is not None)
