"""Fresh copies of uninitialised modules equal a new build (formatted Linears included: the routed experts are
copies of a formatted first one); the loader's tensor listing equals ``state_dict``; loading pauses the cyclic
collector and resumes it without a pass over what the load made."""

from __future__ import annotations

import gc

import pytest
import torch
from torch import nn

from atom.models.deepseek_v4 import loader
from atom.models.deepseek_v4.config import DeepseekV4Config
from atom.models.deepseek_v4.layers import Linear
from atom.models.deepseek_v4.loader import collection_paused, load_checkpoint, named_tensors, plan_model
from atom.models.deepseek_v4.make_tiny_checkpoint import main as make_tiny_main
from atom.models.deepseek_v4.model import DeepseekV4Model
from atom.models.deepseek_v4.module_copy import fresh_copy
from atom.models.deepseek_v4.moe import Expert


def _layout(module: nn.Module) -> list[tuple[str, tuple[int, ...], torch.dtype, str, bool]]:
    return [(n, tuple(t.shape), t.dtype, t.device.type, t.requires_grad) for n, t in module.state_dict().items()]


def _plain_attrs(module: nn.Module) -> dict[str, object]:
    return {k: v for k, v in vars(module).items() if not k.startswith("_")}


def test_a_fresh_copy_of_an_expert_has_the_layout_and_attributes_of_a_new_one_and_shares_no_tensor():
    cfg = DeepseekV4Config.tiny()
    original, built = Expert(cfg, dtype=torch.bfloat16, device="cpu"), Expert(cfg, dtype=torch.bfloat16, device="cpu")
    copy = fresh_copy(original)
    assert type(copy) is Expert and _layout(copy) == _layout(built)
    assert [type(m) for m in copy.modules()] == [Expert, Linear, Linear, Linear]
    for name in ("w1", "w2", "w3"):
        assert _plain_attrs(getattr(copy, name)) == _plain_attrs(getattr(built, name))
        assert getattr(copy, name) is not getattr(original, name)
        assert getattr(copy, name).weight.data_ptr() != getattr(original, name).weight.data_ptr()
    assert copy._parameters is not original._parameters and copy._forward_hooks is not original._forward_hooks
    copy.w1.weight.data.fill_(1.0)
    copy.register_forward_hook(lambda *a: None)
    assert len(original._forward_hooks) == 0  # the copy's hook dict is its own


def test_a_fresh_copy_of_a_formatted_linear_equals_set_format_on_a_new_one():
    proto = Linear(128, 256, dtype=torch.bfloat16, device="meta")
    proto.set_format("mxfp4", act_quant=True)
    built = Linear(128, 256, dtype=torch.bfloat16, device="meta")
    built.set_format("mxfp4", act_quant=True)
    copy = fresh_copy(proto)
    assert _layout(copy) == _layout(built) == [("weight", (256, 64), torch.uint8, "meta", False),
                                               ("scale", (256, 4), torch.float8_e8m0fnu, "meta", False)]
    assert _plain_attrs(copy) == _plain_attrs(built) and copy.act_block == built.act_block > 0


def test_a_module_with_a_mutable_attribute_is_refused_naming_it():
    module = nn.Module()
    module.seen = []
    with pytest.raises(TypeError, match=r"Module\.seen is a list, which fresh_copy would share"):
        fresh_copy(module)


def test_the_loaders_tensor_listing_equals_state_dict_on_the_reference_model():
    model = DeepseekV4Model(DeepseekV4Config.tiny(), device="meta")
    listed, reference = named_tensors(model), model.state_dict(keep_vars=True)
    assert list(listed) == list(reference) and all(listed[k] is reference[k] for k in reference)


def test_a_quantized_load_gives_every_twin_linear_its_own_tensors_and_the_stored_format(tmp_path):
    make_tiny_main([str(tmp_path), "--fp8", "--fp4-experts"])
    model, _, _ = plan_model(tmp_path)
    experts = model.layers[0].ffn.experts
    assert len(experts) > 2 and {e.w1.fmt for e in experts} == {"mxfp4"}
    assert len({id(e.w1) for e in experts}) == len({id(e.w1.weight) for e in experts}) == len(experts)
    loaded = load_checkpoint(tmp_path)
    assert len({loaded.layers[0].ffn.experts[i].w2.weight.data_ptr() for i in range(len(experts))}) == len(experts)


def test_loading_pauses_the_cyclic_collector_and_restores_its_state(tmp_path, monkeypatch):
    make_tiny_main([str(tmp_path)])
    states = []
    real = loader._read_into
    monkeypatch.setattr(loader, "_read_into", lambda *a: (states.append(gc.isenabled()), real(*a)))
    assert gc.isenabled()
    load_checkpoint(tmp_path)
    assert states == [False] and gc.isenabled()
    gc.disable()
    try:
        with collection_paused():
            pass
        assert not gc.isenabled()  # it was off before, so it stays off
    finally:
        gc.enable()


def test_resuming_the_collector_after_a_pause_runs_no_pass_over_the_objects_made_in_it():
    started: list[int] = []

    def record(phase: str, info: dict) -> None:
        if phase == "start":
            started.append(info["generation"])

    gc.callbacks.append(record)
    try:
        with collection_paused():
            held = [[i] for i in range(20_000)]  # far over the young generation's threshold of 700
        after = [[i] for i in range(10)]
    finally:
        gc.callbacks.remove(record)
    assert started == [] and gc.isenabled() and gc.get_freeze_count() == 0
    assert any(o is held[-1] for o in gc.get_objects(generation=2)) and after


def test_a_template_makes_copies_that_share_no_tensor_module_or_hook_dict():
    from atom.models.deepseek_v4.module_copy import ModuleTemplate

    template = ModuleTemplate(Expert(DeepseekV4Config.tiny(), device="meta"))
    a, b = template.make(), template.make()
    assert _layout(a) == _layout(b) and a is not b and a.w1 is not b.w1 and a.w1.weight is not b.w1.weight
    assert a._forward_hooks is not b._forward_hooks and a.w1._parameters is not b.w1._parameters
