"""rope_kv_write: the torch reference is the unfused chain (RoPE, the release's round trip, swa_write) value for
value; the Triton kernel (interpreter) writes the bytes of the unfused Triton chain (the rope kernel, the round
trip, the swa_write kernel) and equals the reference up to the last bit of cos / sin on the RoPE dims."""

import pytest
import torch
from support.kernels import arena_rows, assert_same_bits, bits, i32, random_table

from atom.kernels.fp8_ds_mla import Fp8DsMlaLayout
from atom.kernels.rms_norm import rms_norm, rms_norm_ref
from atom.kernels.rope import rope
from atom.kernels.rope_kv_write import rope_kv_write, rope_kv_write_ref
from atom.kernels.swa_write import swa_write, swa_write_ref
from atom.models.deepseek_v4.quant import kv_row_roundtrip
from atom.models.deepseek_v4.rope import apply_rope, rope_frequencies

BS, STRIDE = 8, 11  # row_stride != block_size, as in the fused c4 page
GEOMETRIES = {"tiny": (24, 8, 8), "mid": (64, 32, 16), "release": (448, 64, 64)}  # NoPE, RoPE, FP8 block
ROWS = ("fp32", "bf16", "fp8_ds_mla")
SHAPES = ("ragged", "one token", "ring wrap")


def batch(shape: str, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """``(swa_table, seq_idx, positions, num_pages)`` of one step: every destination row written once.

    ``ragged``: 4 sequences with chunks of 0-12 tokens at random starts, 20% of the table missing, one padding
    token. ``one token``: a single decode token. ``ring wrap``: two sequences whose window pages form a ring of
    3 physical pages (logical block ``b`` in page ``ring[b % 3]``, block 0 released to make room), each writing
    the positions that cross from block 2 into block 3, which reuses block 0's page."""
    if shape == "ring wrap":
        rings = [[5, 1, 7], [2, 6, 3]]
        table = i32([[-1] + [ring[b % 3] for b in range(1, 5)] for ring in rings])
        chunk = list(range(3 * BS - 3, 3 * BS + 4))
        seqs, pos = [s for s in (0, 1) for _ in chunk], chunk * 2
        return table, i32(seqs), i32(pos), 8
    max_blocks, num_pages = 5, 24
    table = random_table(4, max_blocks, num_pages, gen, p_missing=0.2)
    if shape == "one token":
        return table, i32([2]), torch.randint(0, max_blocks * BS, (1,), generator=gen, dtype=torch.int32), num_pages
    seqs, pos = [], []
    for s in range(4):
        n = int(torch.randint(0, 13, (1,), generator=gen))
        start = int(torch.randint(0, max_blocks * BS - n + 1, (1,), generator=gen))
        seqs += [s] * n
        pos += list(range(start, start + n))
    at = int(torch.randint(0, len(seqs) + 1, (1,), generator=gen))
    seqs.insert(at, -1)
    pos.insert(at, 3)  # padding: skipped whatever its position
    return table, i32(seqs), i32(pos), num_pages


def make_rows(fmt: str, num_rows: int, width: int, codec: Fp8DsMlaLayout) -> tuple[torch.Tensor, torch.Tensor]:
    """A NaN (0xFF) flat buffer and a strided row view into it at an odd offset."""
    if fmt == "fp8_ds_mla":
        return arena_rows(num_rows, codec.row_bytes, torch.uint8)
    return arena_rows(num_rows, width, torch.float32 if fmt == "fp32" else torch.bfloat16)


def case(geometry: str, shape: str, dtype: torch.dtype, gen: torch.Generator):
    nope, rd, block = GEOMETRIES[geometry]
    table, seqs, positions, num_pages = batch(shape, gen)
    wide = torch.randn(seqs.numel(), nope + rd + 5, generator=gen) * 4.0
    wide[:, : nope // 3] *= 1e-3  # NoPE blocks of very different magnitudes (different scales)
    kv = wide.to(dtype)[:, : nope + rd]  # a row stride wider than the row
    freqs = rope_frequencies(rd, 10000.0)
    return kv, table, seqs, positions, freqs, num_pages * STRIDE, Fp8DsMlaLayout(nope=nope, rope=rd, qblock=block)


def unfused(rotate, write, kv, rows, table, seqs, positions, freqs, fp8_block, codec, nope):
    """What the serving attention ran before the fusion: rotate, the model's round trip, the view's values, write."""
    y = rotate(kv, positions, freqs)
    if fp8_block:
        y = kv_row_roundtrip(y, nope, fp8_block)
    values = (y if codec is not None else y.to(rows.dtype)).contiguous()
    write(values, rows, table, seqs, positions, block_size=BS, row_stride=STRIDE, codec=codec)


def run_both(fused, rotate, write, geometry, shape, dtype, fmt, quant, gen):
    kv, table, seqs, positions, freqs, num_rows, layout = case(geometry, shape, dtype, gen)
    codec = layout if fmt == "fp8_ds_mla" else None
    fp8_block = layout.qblock if quant else 0
    got_buf, got = make_rows(fmt, num_rows, kv.shape[1], layout)
    want_buf, want = make_rows(fmt, num_rows, kv.shape[1], layout)
    fused(kv, got, table, seqs, positions, freqs, block_size=BS, row_stride=STRIDE, fp8_block=fp8_block, codec=codec)
    unfused(rotate, write, kv, want, table, seqs, positions, freqs, fp8_block, codec, layout.nope)
    return got_buf, want_buf, got, want, layout, kv


def selected(g: str, s: str, d: torch.dtype, q: bool) -> bool:
    """Every combination on the tiny geometry; ragged batches on the mid one; at the release's widths the
    release numerics (bf16, round trip) and fp32 without it, one token and across the ring's wrap."""
    if g == "mid":
        return s == "ragged"
    return g == "tiny" or (s != "ragged" and q == (d == torch.bfloat16))


def fast(g: str, s: str, d: torch.dtype, f: str, q: bool) -> bool:
    """The cases of the fast loop: every dtype, row format and round trip on tiny ragged batches, plus one case
    of each other geometry (the release numerics: bf16 into fp8_ds_mla rows with the round trip, mid ragged and
    release across the ring's wrap) and the release width in fp32 for one token. The rest run under ``slow``."""
    if g == "tiny":
        return s == "ragged"
    if g == "release" and s == "one token":
        return (d, f, q) == (torch.float32, "fp32", False)
    return (d, f, q) == (torch.bfloat16, "fp8_ds_mla", True) and s in ("ragged", "ring wrap")


PARAMS = [pytest.param(g, s, d, f, q, id=f"{g}-{s}-{str(d)[6:]}-{f}-{'quant' if q else 'plain'}",
                       marks=() if fast(g, s, d, f, q) else pytest.mark.slow)
          for g in GEOMETRIES for s in SHAPES for d in (torch.float32, torch.bfloat16) for f in ROWS
          for q in (False, True) if selected(g, s, d, q)]


@pytest.mark.parametrize("geometry,shape,dtype,fmt,quant", PARAMS)
def test_the_reference_writes_what_the_torch_backend_wrote_before_the_fusion(geometry, shape, dtype, fmt, quant, gen):
    got_buf, want_buf, got, _, layout, _ = run_both(rope_kv_write_ref, apply_rope, swa_write_ref, geometry, shape,
                                                 dtype, fmt, quant, gen)
    assert_same_bits(got_buf, want_buf)
    untouched, _ = make_rows(fmt, got.shape[0], got.shape[1], layout)
    assert not torch.equal(bits(got_buf), bits(untouched))  # rows were written


@pytest.mark.parametrize("geometry,shape,dtype,fmt,quant", PARAMS)
def test_triton_writes_the_bytes_of_the_rope_kernel_round_trip_and_swa_write_kernel(geometry, shape, dtype, fmt,
                                                                                      quant, gen):
    got_buf, want_buf, *_ = run_both(rope_kv_write, rope, swa_write, geometry, shape, dtype, fmt, quant, gen)
    assert_same_bits(got_buf, want_buf)


def rope_columns(fmt: str, layout: Fp8DsMlaLayout) -> slice:
    """The elements (bytes for fp8_ds_mla) of a row that hold its RoPE dims."""
    if fmt == "fp8_ds_mla":
        return slice(layout.nope, layout.nope + 2 * layout.rope)
    return slice(layout.nope, layout.nope + layout.rope)


def rope_values(rows: torch.Tensor, fmt: str, layout: Fp8DsMlaLayout) -> torch.Tensor:
    part = rows[:, rope_columns(fmt, layout)].contiguous()
    return (part.view(torch.bfloat16) if fmt == "fp8_ds_mla" else part).float()


@pytest.mark.parametrize("geometry,shape,dtype,fmt,quant", PARAMS)
def test_triton_equals_the_reference_bit_for_bit_but_the_last_bit_of_cos_and_sin(geometry, shape, dtype, fmt, quant,
                                                                                   gen):
    got_buf, want_buf, got, want, layout, kv = run_both(rope_kv_write, apply_rope, swa_write_ref, geometry, shape,
                                                    dtype, fmt, quant, gen)
    a, b = rope_values(got, fmt, layout), rope_values(want, fmt, layout)
    live = ~b.isnan()
    assert bool(live.any()) and torch.equal(a.isnan(), b.isnan())
    # cos / sin within an fp32 unit or two of torch's move a rotated value by at most 2^-22 (|e| + |o|) ...
    bound = 2.0**-20 * float(kv[:, layout.nope:].float().abs().max())
    if fmt != "fp32" or dtype == torch.bfloat16 or quant:  # ... which a bf16 store can turn into one bf16 unit
        bound = bound + 2.0**-7 * torch.maximum(a.abs(), b.abs())[live]
    assert bool(((a - b).abs()[live] <= bound).all())
    got[:, rope_columns(fmt, layout)] = want[:, rope_columns(fmt, layout)]
    assert_same_bits(got_buf, want_buf)  # everything else: the NoPE values / bytes, scales, padding, skipped rows


NORMED = [pytest.param(g, s, d, f, q, id=f"{g}-{s}-{str(d)[6:]}-{f}-{'quant' if q else 'plain'}",
                       marks=() if g == "tiny" else pytest.mark.slow)
          for g, s, d, f, q in [("tiny", "ragged", torch.float32, "fp32", False),
                                ("tiny", "ragged", torch.bfloat16, "fp8_ds_mla", True),
                                ("tiny", "one token", torch.bfloat16, "bf16", True),
                                ("release", "ring wrap", torch.bfloat16, "fp8_ds_mla", True),
                                ("release", "one token", torch.float32, "fp32", False)]]


@pytest.mark.parametrize("geometry,shape,dtype,fmt,quant", NORMED)
def test_with_kv_norm_the_write_is_the_rms_norm_then_the_unnormed_write(geometry, shape, dtype, fmt, quant, gen):
    kv, table, seqs, positions, freqs, num_rows, layout = case(geometry, shape, dtype, gen)
    codec = layout if fmt == "fp8_ds_mla" else None
    weight = (torch.rand(kv.shape[1], generator=gen) + 0.5).to(dtype)
    geo = dict(block_size=BS, row_stride=STRIDE, fp8_block=layout.qblock if quant else 0, codec=codec)
    for fused, norm in ((rope_kv_write, rms_norm), (rope_kv_write_ref, rms_norm_ref)):
        got_buf, got = make_rows(fmt, num_rows, kv.shape[1], layout)
        want_buf, want = make_rows(fmt, num_rows, kv.shape[1], layout)
        fused(kv, got, table, seqs, positions, freqs, norm_weight=weight, norm_eps=1e-6, **geo)
        fused(norm(kv, weight, 1e-6), want, table, seqs, positions, freqs, **geo)
        assert_same_bits(got_buf, want_buf)


@pytest.mark.parametrize("fn", [rope_kv_write, rope_kv_write_ref], ids=["triton", "torch"])
def test_a_bad_kv_norm_is_refused_naming_it(fn):
    args = good_args()
    with pytest.raises(ValueError, match="weight must be None or a \\[32\\]"):
        fn(**args, block_size=BS, row_stride=STRIDE, norm_weight=torch.ones(31))
    with pytest.raises(ValueError, match="eps must be a float >= 0"):
        fn(**args, block_size=BS, row_stride=STRIDE, norm_weight=torch.ones(32), norm_eps=-1.0)


@pytest.mark.parametrize("fn", [rope_kv_write, rope_kv_write_ref], ids=["triton", "torch"])
def test_padding_tokens_and_missing_pages_are_skipped_and_never_fall_back_to_page_zero(fn):
    _, rows = arena_rows(4 * STRIDE, 12, torch.float32)
    kv, freqs = torch.ones(4, 12), rope_frequencies(4, 10000.0)
    fn(kv, rows, i32([[-1, -1, 3]]), i32([0, 0, -1, 0]), i32([0, 9, 17, 17]), freqs, block_size=BS,
       row_stride=STRIDE)
    written = (~rows.isnan().all(1)).nonzero().flatten().tolist()
    assert written == [3 * STRIDE + 1]
    assert rows[3 * STRIDE + 1, :8].tolist() == [1.0] * 8  # NoPE dims copied


def good_args(codec: Fp8DsMlaLayout | None = None) -> dict:
    _, rows = (arena_rows(4 * STRIDE, codec.row_bytes, torch.uint8) if codec else
               arena_rows(4 * STRIDE, 32, torch.float32))
    return dict(kv=torch.zeros(2, 32), rows=rows, swa_table=i32([[0, 1], [2, 3]]), seq_idx=i32([0, 1]),
                positions=i32([0, 9]), freqs=rope_frequencies(8, 10000.0), fp8_block=8, codec=codec)


CODEC = Fp8DsMlaLayout(nope=24, rope=8, qblock=8)
BAD_CASES = {
    "kv in float64": (None, "kv", lambda a: a["kv"].double(), "kv has dtype"),
    "kv inner dim strided": (None, "kv", lambda a: torch.zeros(2, 64)[:, ::2], "kv must have a contiguous"),
    "freqs not fp32": (None, "freqs", lambda a: a["freqs"].double(), "freqs must be a 1-d fp32"),
    "freqs wider than kv": (None, "freqs", lambda a: torch.ones(17), "2 \\* len\\(freqs\\) = 34"),
    "fp8_block not dividing NoPE": (None, "fp8_block", lambda a: 16, "fp8_block=16 must be a power of two"),
    "fp8_block negative": (None, "fp8_block", lambda a: -1, "fp8_block must be an int >= 0"),
    "plain rows of another width": (None, "rows", lambda a: arena_rows(40, 31, torch.float32)[1], "rows has inner"),
    "byte rows without a codec": (None, "rows", lambda a: arena_rows(40, 32, torch.uint8)[1], "rows has dtype"),
    "codec of other dims": (CODEC, "codec", lambda a: Fp8DsMlaLayout(nope=16, rope=16, qblock=8), "codec"),
    "fp8_block other than the codec's": (CODEC, "fp8_block", lambda a: 4, "must equal the codec's qblock=8"),
    "table page past the rows": (None, "swa_table", lambda a: i32([[0, 1], [2, 4]]), "swa_table"),
    "seq_idx past the table": (None, "seq_idx", lambda a: i32([0, 2]), "seq_idx"),
    "position past the table": (None, "positions", lambda a: i32([0, 16]), "positions"),
    "positions int64": (None, "positions", lambda a: a["positions"].long(), "positions must be int32"),
}


@pytest.mark.parametrize("case_name", list(BAD_CASES))
@pytest.mark.parametrize("fn", [rope_kv_write, rope_kv_write_ref], ids=["triton", "torch"])
def test_the_wrapper_rejects_bad_arguments_naming_them_before_writing(fn, case_name):
    codec, name, make, needle = BAD_CASES[case_name]
    args = good_args(codec)
    args[name] = make(args)
    before = args["rows"].clone()
    with pytest.raises(ValueError, match=needle):
        fn(args["kv"], args["rows"], args["swa_table"], args["seq_idx"], args["positions"], args["freqs"],
           block_size=BS, row_stride=STRIDE, fp8_block=args["fp8_block"], codec=args["codec"])
    assert_same_bits(args["rows"], before)
