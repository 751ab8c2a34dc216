"""fused_moe: the torch reference equals a per-pair loop over the reference model's expert arithmetic, and the
Triton kernel (interpreter) equals the reference at random ragged routings: dense fp32 / bf16, FP8 and MXFP4
experts, hash-style routings with repeated picks across tokens, experts no pair reaches, one token, FP8
activation blocks, and an expert-parallel slice."""

import pytest
import torch
import torch.nn.functional as F

from atom.kernels.fp8_gemm import fp8_block_gemm_ref
from atom.kernels.fused_moe import fused_moe, fused_moe_ref
from atom.kernels.mxfp4_gemm import mxfp4_gemm_ref
from atom.models.deepseek_v4.quant import fp8_roundtrip

E, D, I = 6, 64, 32


def routing(t, k, gen, experts=E, hashed=False):
    """``(route_w fp32 [t, k], route_idx int64 [t, k])``: distinct experts per token, drawn from the first
    ``experts - 2`` ids so the last two get no pair; hashed: every token picks from a fixed table by id parity."""
    if hashed:
        table = torch.stack([torch.randperm(experts - 2, generator=gen)[:k] for _ in range(2)])
        idx = table[torch.arange(t) % 2]
    else:
        idx = torch.stack([torch.randperm(experts - 2, generator=gen)[:k] for _ in range(t)])
    return torch.rand(t, k, generator=gen) + 0.1, idx


def experts(fmt, gen, dtype=torch.float32):
    """Stacked ``(w1, w3, w2, s1, s3, s2)`` of ``E`` experts in ``fmt``."""
    def one(n, k):
        if fmt == "dense":
            return (torch.randn(E, n, k, generator=gen) * 0.2).to(dtype), None
        if fmt == "fp8":
            w = (torch.randn(E, n, k, generator=gen) * 2).to(torch.float8_e4m3fn)
            s = torch.randint(120, 126, (E, -(-n // 128), -(-k // 128)), generator=gen, dtype=torch.uint8)
        else:
            w = torch.randint(0, 256, (E, n, k // 2), generator=gen, dtype=torch.uint8)
            s = torch.randint(120, 126, (E, n, k // 32), generator=gen, dtype=torch.uint8)
        return w, s.view(torch.float8_e8m0fnu)
    (w1, s1), (w3, s3), (w2, s2) = one(I, D), one(I, D), one(D, I)
    return w1, w3, w2, s1, s3, s2


def per_pair(x, route_w, idx, w1, w3, w2, s1, s3, s2, limit, act_blocks=(0, 0)):
    """Each token's pairs in ascending expert order through ``Expert.forward``'s arithmetic, one pair at a time."""
    def gemm(a, w, s, e):
        if s is None:
            return F.linear(a, w[e])
        op = fp8_block_gemm_ref if w.dtype == torch.float8_e4m3fn else mxfp4_gemm_ref
        return op(a, w[e], s[e])
    out = torch.zeros(x.shape[0], x.shape[1])
    for t in range(x.shape[0]):
        xt = x[t:t + 1]
        if act_blocks[0]:
            xt = fp8_roundtrip(xt, act_blocks[0])
        for e in sorted(idx[t].tolist()):
            slot = idx[t].tolist().index(e)
            gate, up = gemm(xt, w1, s1, e).float(), gemm(xt, w3, s3, e).float()
            up, gate = up.clamp(-limit, limit), gate.clamp(max=limit)
            h = (route_w[t, slot] * (F.silu(gate) * up)).to(x.dtype)
            if act_blocks[1]:
                h = fp8_roundtrip(h, act_blocks[1])
            out[t] += gemm(h, w2, s2, e).float()[0]
    return out


@pytest.mark.parametrize("fmt", ["dense", "fp8", "mxfp4"])
def test_the_reference_equals_a_loop_over_the_routed_pairs(fmt, gen):
    x = torch.randn(7, D, generator=gen)
    route_w, idx = routing(7, 2, gen)
    w = experts(fmt, gen)
    for blocks in ((0, 0), (64, 32)):
        got = fused_moe_ref(x, route_w, idx, *w, limit=3.0, act_blocks=blocks)
        want = per_pair(x, route_w, idx, *w, limit=3.0, act_blocks=blocks)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))


@pytest.mark.parametrize("fmt", ["dense", "fp8", "mxfp4"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_triton_kernel_equals_the_reference_at_random_ragged_routings(fmt, dtype, gen):
    w = experts(fmt, gen, dtype)
    for t, k, hashed, blocks in ((1, 1, False, (0, 0)), (9, 3, False, (32, 32)), (13, 2, True, (64, 16))):
        x = torch.randn(t, D, generator=gen).to(dtype)
        route_w, idx = routing(t, k, gen, hashed=hashed)
        want = fused_moe_ref(x, route_w, idx, *w, limit=2.0, act_blocks=blocks)
        got = fused_moe(x, route_w, idx.to(torch.int32), *w, limit=2.0, act_blocks=blocks)
        if dtype == torch.bfloat16:  # same bf16 roundings; only the fp32 summation order of the dots differs
            torch.testing.assert_close(got, want, rtol=2 ** -7, atol=2 ** -7 * float(want.abs().max()))
        else:
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))


def test_an_expert_parallel_slice_adds_only_the_pairs_of_its_experts(gen):
    w1, w3, w2, *_ = experts("dense", gen)
    x = torch.randn(8, D, generator=gen)
    route_w, idx = routing(8, 2, gen)
    whole = [fused_moe_ref(x, route_w * (idx // 3 == part), idx, w1, w3, w2, limit=2.0) for part in (0, 1)]
    for part in (0, 1):
        piece = slice(3 * part, 3 * part + 3)
        ref = fused_moe_ref(x, route_w, idx, w1[piece], w3[piece], w2[piece], limit=2.0, first_expert=3 * part)
        tri = fused_moe(x, route_w, idx, w1[piece], w3[piece], w2[piece], limit=2.0, first_expert=3 * part)
        torch.testing.assert_close(ref, whole[part], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(tri, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_shared_experts_output_is_added_onto_the_routed_sum(dtype, gen):
    w = experts("fp8", gen, dtype)
    for t, k in ((1, 2), (11, 3)):
        x = torch.randn(t, D, generator=gen).to(dtype)
        shared = torch.randn(t, D, generator=gen).to(dtype)
        route_w, idx = routing(t, k, gen)
        routed = fused_moe_ref(x, route_w, idx, *w, limit=2.0, act_blocks=(32, 32))
        want = fused_moe_ref(x, route_w, idx, *w, limit=2.0, act_blocks=(32, 32), shared=shared)
        assert torch.equal(want, routed + shared.float())  # the reference layer's order: routed sum, then shared
        got = fused_moe(x, route_w, idx, *w, limit=2.0, act_blocks=(32, 32), shared=shared)
        tol = 2 ** -7 if dtype == torch.bfloat16 else 1e-5
        torch.testing.assert_close(got, want, rtol=tol, atol=tol * float(want.abs().max()))


def test_no_pairs_return_the_shared_output_alone(gen):
    w = experts("dense", gen)
    shared = torch.randn(3, D, generator=gen).to(torch.bfloat16)
    for op in (fused_moe, fused_moe_ref):
        out = op(torch.randn(3, D, generator=gen), torch.empty(3, 0), torch.empty(3, 0, dtype=torch.long), *w,
                 limit=1.0, shared=shared)
        assert out.dtype == torch.float32 and torch.equal(out, shared.float())


def test_no_tokens_give_an_empty_sum(gen):
    w = experts("dense", gen)
    empty = torch.empty(0, D)
    for op in (fused_moe, fused_moe_ref):
        out = op(empty, torch.empty(0, 2), torch.empty(0, 2, dtype=torch.long), *w, limit=1.0)
        assert out.shape == (0, D) and out.dtype == torch.float32


@pytest.mark.parametrize("op", [fused_moe, fused_moe_ref])
def test_bad_arguments_are_refused_naming_what_is_wrong(op, gen):
    w1, w3, w2, *_ = experts("dense", gen)
    x = torch.randn(3, D, generator=gen)
    route_w, idx = routing(3, 2, gen)
    with pytest.raises(ValueError, match="route_w must be fp32"):
        op(x, route_w.double(), idx, w1, w3, w2, limit=1.0)
    with pytest.raises(ValueError, match="w2 must be dense of shape"):
        op(x, route_w, idx, w1, w3, w2[:, :, :16], limit=1.0)
    with pytest.raises(ValueError, match="act_blocks must be two blocks"):
        op(x, route_w, idx, w1, w3, w2, limit=1.0, act_blocks=(48, 0))
    with pytest.raises(ValueError, match="negative expert id"):
        op(x, route_w, -idx - 1, w1, w3, w2, limit=1.0)
    with pytest.raises(ValueError, match="shared .the shared expert's output. must be x's shape"):
        op(x, route_w, idx, w1, w3, w2, limit=1.0, shared=torch.zeros(3, D + 1))
    fp8 = experts("fp8", gen)
    with pytest.raises(ValueError, match="needs e8m0 scales"):
        op(x, route_w, idx, *fp8[:3], None, *fp8[4:], limit=1.0)
