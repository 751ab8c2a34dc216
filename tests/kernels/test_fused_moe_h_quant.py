"""fused_moe's ``h_quant`` hook (the rounding of the activations in front of ``w2``, supplied by the caller, as a
tensor-parallel rank does when its ``w2`` input blocks span ranks): a hook doing the op's own FP8 round trip
gives the op's result bit for bit, in the torch reference and the Triton kernel (interpreter); it is called
once on the ``[T*k, I]`` sorted pairs; combined with an ``h`` block, or returning another shape, it is refused."""

import pytest
import torch

from atom.kernels.fused_moe import fused_moe, fused_moe_ref
from atom.models.deepseek_v4.quant import fp8_roundtrip

E, D, I = 6, 64, 32


def routed(t: int, k: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(x [t, D], route_w [t, k], route_idx [t, k])``: distinct experts per token among the first ``E - 1``."""
    idx = torch.stack([torch.randperm(E - 1, generator=gen)[:k] for _ in range(t)])
    return torch.randn(t, D, generator=gen), torch.rand(t, k, generator=gen) + 0.1, idx


def fp8_experts(gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    """Stacked FP8 ``(w1, w3, w2, s1, s3, s2)`` of ``E`` experts (e8m0 block scales)."""
    def one(n: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        w = (torch.randn(E, n, k, generator=gen) * 2).to(torch.float8_e4m3fn)
        s = torch.randint(120, 126, (E, -(-n // 128), -(-k // 128)), generator=gen, dtype=torch.uint8)
        return w, s.view(torch.float8_e8m0fnu)
    (w1, s1), (w3, s3), (w2, s2) = one(I, D), one(I, D), one(D, I)
    return w1, w3, w2, s1, s3, s2


@pytest.mark.parametrize("op", [fused_moe_ref, fused_moe])
def test_a_hook_doing_the_ops_own_round_trip_gives_the_ops_result_bit_for_bit(op, gen):
    w = fp8_experts(gen)
    x, route_w, idx = routed(9, 3, gen)
    seen: list[tuple[int, ...]] = []

    def hook(h: torch.Tensor) -> torch.Tensor:
        seen.append(tuple(h.shape))
        return fp8_roundtrip(h, 16)

    want = op(x, route_w, idx, *w, limit=2.0, act_blocks=(32, 16))
    got = op(x, route_w, idx, *w, limit=2.0, act_blocks=(32, 0), h_quant=hook)
    assert seen == [(9 * 3, I)]
    assert torch.equal(got, want)
    unrounded = op(x, route_w, idx, *w, limit=2.0, act_blocks=(32, 0))
    assert not torch.equal(unrounded, want)  # the hook's rounding is what made them equal


@pytest.mark.parametrize("op", [fused_moe_ref, fused_moe])
def test_a_hook_next_to_an_h_block_or_changing_hs_shape_is_refused(op, gen):
    w = fp8_experts(gen)
    x, route_w, idx = routed(4, 2, gen)
    with pytest.raises(ValueError, match=r"act_blocks\[1\] must then be 0"):
        op(x, route_w, idx, *w, limit=2.0, act_blocks=(32, 16), h_quant=lambda h: h)
    with pytest.raises(ValueError, match="h_quant must return h's shape"):
        op(x, route_w, idx, *w, limit=2.0, h_quant=lambda h: h[:, : I // 2])
