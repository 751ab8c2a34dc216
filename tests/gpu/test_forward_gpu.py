"""On a GPU: decode steps replayed from CUDA graphs against the same steps run eagerly, and the kernels
of the host-free forward (entry pooling, indexer scores over value rows, mHC Sinkhorn) against their
torch references at DSV4-Flash geometry.

Skipped on machines without CUDA/ROCm. Run in its own session (``pytest tests/gpu``): the CPU kernel
tests set ``TRITON_INTERPRET=1`` for the whole process, and these tests must exercise compiled code.
"""


import pytest
import torch

from support.gpu import gpu_module_marks

pytestmark = gpu_module_marks("tests/engine/test_decode_buffers.py runs the padded decode inputs on the CPU")

DEV = "cuda"



@pytest.fixture
def gen():
    return torch.Generator().manual_seed(5)


@torch.no_grad()
def test_decode_steps_replayed_from_cuda_graphs_give_the_logits_of_the_same_steps_run_eagerly():
    from support.decode_runs import sampled_run, thin_model

    model = thin_model(DEV)
    eager_tokens, eager_logits = sampled_run(model, "padded", kernel_backend="triton")
    graph_tokens, graph_logits = sampled_run(model, "graph", kernel_backend="triton")
    assert graph_tokens == eager_tokens
    assert len(graph_logits) == len(eager_logits)
    for a, b in zip(graph_logits, eager_logits):
        assert torch.equal(a, b)


def test_entry_pool_equals_the_reference_at_csa_geometry(gen):
    from atom.kernels.entry_pool import entry_pool, entry_pool_ref

    tokens, full, width, slots, ring, entries = 300, 1024, 512, 64, 8, 96  # CSA: two 512-wide halves
    kv, score = (torch.randn(tokens, full, generator=gen).to(DEV) for _ in range(2))
    ring_kv, ring_score = (torch.randn(slots, ring, full, generator=gen).to(DEV) for _ in range(2))
    fresh = torch.randint(-1, tokens, (entries, 2 * ring), generator=gen, dtype=torch.int32)
    ring_row = torch.randint(0, slots * ring, (entries, 2 * ring), generator=gen, dtype=torch.int32)
    ring_row[fresh >= 0] = -1
    fresh[:4, :ring], ring_row[:4, :ring] = -1, -1  # the first block's missing previous half
    col = torch.tensor([0] * ring + [width] * ring, dtype=torch.int32)
    ape = torch.randn(4, full, generator=gen).to(DEV)
    positions = torch.randint(0, 100_000, (tokens,), generator=gen, dtype=torch.int32).to(DEV)
    args = (kv, score, ape, positions, ring_kv, ring_score, fresh.to(DEV), ring_row.to(DEV), col.to(DEV))
    torch.testing.assert_close(entry_pool(*args, width=width), entry_pool_ref(*args, width=width),
                               rtol=1e-5, atol=1e-5)


def test_index_score_over_value_keys_equals_the_reference(gen):
    from atom.kernels.index_score import index_score, index_score_ref

    keys = torch.randn(4096, 128, generator=gen).to(DEV)
    q = torch.randn(32, 64, 128, generator=gen).to(DEV)
    w = torch.randn(32, 64, generator=gen).to(DEV)
    idx = torch.randint(-1, 4096, (32, 2048), generator=gen, dtype=torch.int32).to(DEV)
    got, ref = index_score(q, w, keys, idx), index_score_ref(q, w, keys, idx)
    assert torch.equal(got.isinf(), ref.isinf())
    finite = ~ref.isinf()
    torch.testing.assert_close(got[finite], ref[finite], rtol=1e-4, atol=1e-3)


def test_the_registered_sinkhorn_op_runs_the_triton_body_on_cuda_and_equals_the_reference(gen):
    from atom.kernels.hc_sinkhorn import hc_sinkhorn, hc_sinkhorn_ref

    comb = (torch.randn(2048, 4, 4, generator=gen) * 3).to(DEV)
    ref = hc_sinkhorn_ref(comb, 20, 1e-6)
    assert torch.equal(torch.ops.atom.hc_sinkhorn(comb, 20, 1e-6), hc_sinkhorn(comb, 20, 1e-6))
    torch.testing.assert_close(hc_sinkhorn(comb, 20, 1e-6), ref, rtol=1e-6, atol=1e-6)
