"""The host tier's copies on a GPU: pinned host buffer, a copy stream of their own whose event the step's
stream waits on, and the same bytes as the CPU path (stores, then loads) for SWA and compressed pages.

Skipped on machines without CUDA/ROCm. Run in its own session (``pytest tests/gpu``): the copies of SWA pages
use the compiled ``copy_pages`` kernel.
"""

import pytest
import torch

from atom.config import CacheConfig, Dsv4KvSpec, SchedulerConfig
from atom.kernels.backend import load_kernels
from atom.kernels.page_copy import copy_pages_reference
from atom.kv.kv_layout import KvLayout
from atom.kv.page_map import COMPRESS, SWA
from atom.model_executor.host_copies import HostCopies
from atom.step_contract import HostCopy
from support.gpu import gpu_module_marks

pytestmark = gpu_module_marks("tests/engine/test_host_copies.py and tests/engine/test_host_tier.py cover the "
                              "same copies on the CPU")

SPEC = Dsv4KvSpec(compress_ratios=(0, 4, 16, 4, 16, 4, 0), sliding_window=8, head_dim=32, rope_head_dim=8,
                  index_head_dim=16, row_format="fp32")
ORDERS = ((HostCopy(SWA, (1, 9, 3), (0, 5, 2)), HostCopy(COMPRESS, (0, 40, 7), (3, 1, 30))),
          (HostCopy(SWA, (5, 0), (4, 8)), HostCopy(COMPRESS, (1, 3), (2, 41))))


def pair(num_chunks=6, host_chunks=4):
    limits = SchedulerConfig(max_num_batched_tokens=32, max_num_seqs=4, max_model_len=128)
    lay = KvLayout.for_chunks(SPEC, num_chunks, limits, CacheConfig(chunk_pages=2))
    gen = torch.Generator().manual_seed(5)
    arena = torch.randint(0, 256, (lay.arena_bytes,), dtype=torch.uint8, generator=gen)
    host = torch.randint(0, 256, (host_chunks * lay.chunk_bytes,), dtype=torch.uint8, generator=gen)
    cpu = HostCopies(lay, host_chunks, arena.clone(), copy_pages_reference)
    gpu = HostCopies(lay, host_chunks, arena.cuda(), load_kernels("triton").copy_pages)
    cpu.host.copy_(host)
    gpu.host.copy_(host)
    return cpu, gpu


def test_gpu_copies_move_the_same_bytes_as_the_cpu_from_a_pinned_buffer_on_a_stream_of_their_own():
    cpu, gpu = pair()
    assert gpu.host.is_pinned() and gpu.stream != torch.cuda.current_stream()
    for stores, loads in zip(ORDERS, ORDERS[::-1]):
        cpu.run(stores, loads)
        gpu.run(stores, loads)
    torch.cuda.current_stream().synchronize()
    assert torch.equal(gpu.arena.cpu(), cpu.arena) and torch.equal(gpu.host, cpu.host)


def test_the_step_stream_waits_for_the_loads_and_the_copies_wait_for_the_steps_writes():
    cpu, gpu = pair()
    arena = gpu.arena
    stream = torch.cuda.current_stream()
    torch.cuda._sleep(50_000_000)  # a long kernel queued on the step's stream before the copies
    arena[: gpu.layout.swa_page_bytes].fill_(7)  # ... and a write of SWA page 0, which the store reads
    gpu.run((HostCopy(SWA, (0,), (6,)),), (HostCopy(SWA, (6,), (3,)),))
    page3 = arena[3 * gpu.layout.swa_page_bytes: 4 * gpu.layout.swa_page_bytes].clone()  # on the step's stream
    stream.synchronize()
    assert bool((page3 == 7).all())
