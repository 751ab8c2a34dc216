"""index_score's ``w_scale``: the indexer's head-weight multiply folded into the score kernel. With it, the reference
and the Triton kernel give the bits they give on the weights multiplied beforehand as the model multiplies them
(``Indexer.head_weights``), fp32 and bf16 weights, plain and FP8 key rows."""

import pytest
import torch
from support.kernels import arena_rows

from atom.kernels.fp8_index_key import DSV4_INDEX_LAYOUT, fp8_index_key_quantize_ref
from atom.kernels.index_score import index_score, index_score_ref

SCALE = 16**-0.5 * 4**-0.5  # the tiny indexer's cI^-0.5 * nI^-0.5: not a power of two, so the product rounds


def inputs(gen: torch.Generator, dtype: torch.dtype, fp8: bool, tokens: int = 5, heads: int = 4, width: int = 40):
    dim = DSV4_INDEX_LAYOUT.dim
    keys = torch.randn(30, dim, generator=gen)
    if fp8:
        _, rows = arena_rows(30, DSV4_INDEX_LAYOUT.row_bytes, torch.uint8)
        rows.copy_(fp8_index_key_quantize_ref(keys, layout=DSV4_INDEX_LAYOUT))
    else:
        _, rows = arena_rows(30, dim, dtype)
        rows.copy_(keys.to(dtype))
    q = torch.randn(tokens, heads, dim, generator=gen).to(dtype)
    w = torch.randn(tokens, heads, generator=gen).to(dtype)
    idx = torch.randint(-1, 30, (tokens, width), generator=gen, dtype=torch.int32)
    return q, w, rows, idx, DSV4_INDEX_LAYOUT if fp8 else None


@pytest.mark.parametrize("fp8", [False, True], ids=["plain-keys", "fp8-keys"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("fn", [index_score, index_score_ref], ids=["triton", "torch"])
def test_a_w_scale_gives_the_scores_of_the_weights_multiplied_as_the_model_does(fn, dtype, fp8, gen):
    q, w, rows, idx, codec = inputs(gen, dtype, fp8)
    got = fn(q, w, rows, idx, codec=codec, w_scale=SCALE)
    want = fn(q, w * SCALE, rows, idx, codec=codec)
    assert torch.equal(got, want)
    assert not torch.equal(got, fn(q, w, rows, idx, codec=codec))  # the scale was applied


@pytest.mark.parametrize("bad", [0.0, -1.0, float("inf"), 1])
@pytest.mark.parametrize("fn", [index_score, index_score_ref], ids=["triton", "torch"])
def test_a_bad_w_scale_is_refused_naming_it(fn, bad, gen):
    q, w, rows, idx, codec = inputs(gen, torch.float32, False)
    with pytest.raises(ValueError, match="w_scale must be a finite float > 0"):
        fn(q, w, rows, idx, codec=codec, w_scale=bad)
