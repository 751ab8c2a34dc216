"""The fake-device counter sees what a GPU would: blocking host-to-device copies, device reads and
value-dependent ops; staged copies and non-blocking reads apart, each at the line of the project that made it."""

import torch

from atom.bench.fake_device import DeviceAccessCounter, fake_cuda
from atom.model_ops.host_staging import stage


def test_each_kind_of_device_access_is_counted():
    with fake_cuda(), DeviceAccessCounter() as c:
        x = torch.zeros(8, device="cuda")
        torch.tensor([1, 2, 3], device="cuda")  # pageable host list -> device: blocking
        torch.ones(4).to(x.device)  # host tensor -> device: blocking
        host = torch.ones(4).to(x.device, non_blocking=True)  # staged
        x.sum().item()
        x.tolist()
        x[x > 0]  # boolean mask: output size from values
        torch.nonzero(x)
        x.to("cpu", non_blocking=True)  # the allowed read
        x[2:4] = 1.0  # a fill on the device: nothing
        (x * host.sum()).max()
    assert c.counts() == {"h2d": 2, "syncs": 2, "data_dependent": 2, "staged_h2d": 1, "token_reads": 1}


def test_staged_step_inputs_cross_in_one_copy_and_keep_their_values():
    fields = [[5, 6, 7], [], [-1, 9]]
    with fake_cuda(), DeviceAccessCounter() as c:
        out = stage(fields, torch.device("cuda", 0))
    assert [tuple(t.shape) for t in out] == [(3,), (0,), (2,)] and all(t.device.type == "cuda" for t in out)
    assert c.counts()["h2d"] == 0 and c.counts()["staged_h2d"] == 1
    assert [site.split(":")[0] for site in c.sites("staged_h2d")] == ["atom/model_ops/host_staging.py"]
    assert [t.tolist() for t in stage(fields, "cpu")] == fields
