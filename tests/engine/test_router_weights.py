"""The router's weight and bias are held in fp32 once the serving model is bound (``cast_fp32_weights``), so
routing a step copies neither, on the torch backend (the reference ``Gate``) or a GPU backend (``ServingMoE.route``:
the router GEMM, then ``moe_route``), and routes exactly as before the cast."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from atom.kernels.backend import load_kernels
from atom.models.deepseek_v4.checkpoint import random_state_dict
from atom.models.deepseek_v4.config import DeepseekV4Config
from atom.models.deepseek_v4_serving import DeepseekV4ForServing
from support.runtime_warnings import FAIL_ON_RUNTIME_WARNINGS

pytestmark = FAIL_ON_RUNTIME_WARNINGS


class CopiesOf(TorchDispatchMode):
    """Records each ``_to_copy`` whose source shares storage with one of ``tensors``."""

    def __init__(self, *tensors: torch.Tensor) -> None:
        super().__init__()
        self.ptrs = {t.untyped_storage().data_ptr() for t in tensors}
        self.copies = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ == "_to_copy" and isinstance(args[0], torch.Tensor) \
                and args[0].untyped_storage().data_ptr() in self.ptrs:
            self.copies += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_a_bound_bf16_model_routes_without_copying_the_router_weight_or_bias(backend):
    cfg = DeepseekV4Config.tiny()
    model = DeepseekV4ForServing(cfg)
    model.load_state_dict(random_state_dict(cfg, seed=4))
    model = model.to(torch.bfloat16).eval()  # the bias too: .to() narrows every floating parameter
    moe = model.layers[-1].ffn  # a top-k layer (it has a bias)
    gen = torch.Generator().manual_seed(9)
    x = torch.randn(4, cfg.dim, generator=gen).to(torch.bfloat16)
    ids = torch.randint(0, cfg.vocab_size, (4,), generator=gen)
    kernels = load_kernels(backend)
    moe.bind_kernels(kernels)
    with CopiesOf(moe.gate.weight, moe.gate.bias) as before:
        want_w, want_idx = moe.route(x, ids)
    assert before.copies == 2  # what every call paid before the cast
    model.cast_fp32_weights()
    assert (moe.gate.weight.dtype, moe.gate.bias.dtype) == (torch.float32, torch.float32)
    ptrs = (moe.gate.weight.data_ptr(), moe.gate.bias.data_ptr())
    for _ in range(2):
        with CopiesOf(moe.gate.weight, moe.gate.bias) as after:
            w, idx = moe.route(x, ids)
        assert after.copies == 0 and (moe.gate.weight.data_ptr(), moe.gate.bias.data_ptr()) == ptrs
        assert torch.equal(w, want_w) and torch.equal(idx, want_idx)
