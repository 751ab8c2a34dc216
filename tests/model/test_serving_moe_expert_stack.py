"""ServingMoE.expert_stack: the held experts' weights stacked once, their parameters views of the stack; kept while
they are, rebuilt when a parameter is replaced; checked without reading data pointers, so the fake-device check
(fake tensors) warns about none."""

import warnings

import torch

from atom.bench.fake_device import fake_cuda, to_fake_cuda
from atom.models.deepseek_v4.config import DeepseekV4Config
from atom.models.deepseek_v4_serving.moe import ServingMoE


def test_the_stack_is_kept_while_the_experts_are_views_of_it_and_rebuilt_when_one_is_replaced():
    cfg = DeepseekV4Config.tiny()
    moe = ServingMoE(cfg, 5)
    for i, ex in enumerate(moe.experts):
        for p in (ex.w1, ex.w3, ex.w2):
            p.weight.data.fill_(float(i))
    stack = moe.expert_stack()
    assert moe.expert_stack() is stack
    assert torch.equal(stack[0][0][:, 0, 0], torch.arange(8.0))
    moe.experts[7].w1.weight.data = torch.full_like(moe.experts[7].w1.weight, 70.0)  # the last held expert
    rebuilt = moe.expert_stack()
    assert rebuilt is not stack and rebuilt[0][0][7, 0, 0].item() == 70.0
    moe.experts[0].w1.weight.data.fill_(-1.0)  # written through the view: the stack holds it, no rebuild
    assert moe.expert_stack() is rebuilt and rebuilt[0][0][0, 0, 0].item() == -1.0


def test_checking_a_stack_of_fake_tensors_reads_no_data_pointer():
    moe = ServingMoE(DeepseekV4Config.tiny(), 5, device="meta")
    with fake_cuda() as mode:
        to_fake_cuda(moe, mode)
        stack = moe.expert_stack()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            again = moe.expert_stack()
    assert again is stack and stack[0][0].device.type == "cuda"
    assert not [w for w in caught if "data pointer" in str(w.message)]
