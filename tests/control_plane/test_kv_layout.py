"""Layout sizing: packing efficiency, byte-disjoint regions, and clear errors on small budgets."""

import pytest

from atom.config import CacheConfig, Dsv4KvSpec, SchedulerConfig
from atom.kv.kv_layout import InsufficientKvMemory, KvLayout, choose_chunk_pages, plan_kv_layout
from atom.models.deepseek_v4.config import DeepseekV4Config

GIB = 1 << 30


def real_spec(name: str, fmt: str = "fp8_ds_mla") -> Dsv4KvSpec:
    return DeepseekV4Config.from_preset(name).kv_spec(fmt)


def plan(spec: Dsv4KvSpec, kv_cache_bytes: int, max_num_seqs: int, max_model_len: int, chunk_pages: int = 0):
    return plan_kv_layout(spec, CacheConfig(kv_cache_bytes=kv_cache_bytes, chunk_pages=chunk_pages),
                          SchedulerConfig(max_num_seqs=max_num_seqs, max_model_len=max_model_len))


def tiny_spec(**kw) -> Dsv4KvSpec:
    args = dict(compress_ratios=(0, 4, 16, 4, 16, 4, 0), sliding_window=8, head_dim=32,
                rope_head_dim=8, index_head_dim=16, row_format="fp32", num_mtp_layers=1)
    args.update(kw)
    return Dsv4KvSpec(**args)


def test_flash_fp8_blocks_have_the_published_sizes():
    spec = real_spec("deepseek_v4_flash")
    assert (spec.block_size, spec.main_row_bytes, spec.index_row_bytes) == (128, 584, 132)
    assert spec.csa_state_bytes == 40 * 1024
    assert spec.swa_block_bytes == 44 * 128 * 584 + 21 * 40960
    assert spec.compressed_block_bytes == 21 * 32 * (584 + 132) + 20 * 584


def test_one_swa_page_per_chunk_packs_flash_compressed_blocks_at_95_percent():
    lay = plan(real_spec("deepseek_v4_flash"), 40 * GIB, 64, 1 << 20, chunk_pages=1)
    assert lay.compress_pages_per_chunk == 8
    assert 0.945 < lay.compressed_packing < 0.951


@pytest.mark.parametrize("name,expected_m,min_packing", [("deepseek_v4_flash", 3, 0.989), ("deepseek_v4_pro", 4, 0.990)])
def test_the_chunk_size_is_chosen_to_pack_compressed_blocks_at_the_target(name, expected_m, min_packing):
    spec = real_spec(name)
    assert choose_chunk_pages(spec, 0.985, 8) == expected_m
    lay = plan(spec, 40 * GIB, 64, 1 << 20)
    assert lay.chunk_pages == expected_m
    assert lay.compressed_packing >= min_packing
    assert lay.swa_packing >= 0.997


def test_nothing_is_reserved_per_live_request_the_whole_budget_becomes_chunks():
    spec = real_spec("deepseek_v4_flash")
    few, many = plan(spec, 40 * GIB, 1, 1 << 20), plan(spec, 40 * GIB, 256, 1 << 20)
    assert few.num_chunks == many.num_chunks == 40 * GIB // few.chunk_bytes
    assert few.state_pool_bytes == many.state_pool_bytes == 0
    assert 40 * GIB - few.arena_bytes < few.chunk_bytes


@pytest.mark.parametrize("name,fmt,pages", [("deepseek_v4_flash", "fp8_ds_mla", 6), ("deepseek_v4_pro", "fp8_ds_mla", 8),
                                            ("deepseek_v4_flash", "bf16", 4), ("deepseek_v4_pro", "bf16", 8)])
def test_request_state_pages_tile_a_chunk_exactly(name, fmt, pages):
    spec = real_spec(name, fmt)
    lay = plan(spec, 40 * GIB, 8, 1 << 20)
    assert lay.state_pages_per_chunk == pages
    assert lay.state_page_bytes * pages == lay.chunk_bytes and lay.state_page_bytes % 4 == 0
    assert lay.state_page_bytes >= spec.request_state_bytes
    assert lay.max_state_pages == lay.num_chunks * pages


@pytest.mark.parametrize("spec", [real_spec("deepseek_v4_flash"), tiny_spec()], ids=["flash-fp8", "tiny-fp32"])
def test_state_parts_of_a_page_never_overlap_and_fill_exactly_one_request_state(spec):
    lay = plan(spec, 40 * GIB, 8, 4096)
    parts = sorted((p.offset, p.offset + p.nbytes, f"L{p.layer} {p.name}")
                   for layer in spec.compressed_layers for p in lay.state_parts(layer).values())
    for (a0, a1, an), (b0, b1, bn) in zip(parts, parts[1:]):
        assert a1 == b0, f"{an} and {bn} are not back to back"
    assert parts[0][0] == 0 and parts[-1][1] == spec.request_state_bytes <= lay.state_page_bytes
    with pytest.raises(KeyError, match="keeps no compressor state"):
        lay.state_parts(0)


def test_a_chunk_too_small_for_one_request_state_is_rejected_or_grown():
    spec = tiny_spec(head_dim=16, index_head_dim=512)  # a CSA ring of 8 wide rows outweighs a 16-row page
    assert spec.request_state_bytes > plan(spec, 1 << 26, 4, 256, chunk_pages=2).swa_page_bytes
    limits = SchedulerConfig(max_num_seqs=4, max_model_len=256)
    grown = plan_kv_layout(spec, CacheConfig(kv_cache_bytes=1 << 26, packing_target=0.01), limits)
    assert choose_chunk_pages(spec, 0.01, 8) == 1  # packing alone would take 1 page per chunk
    assert grown.chunk_pages == 2 and grown.state_pages_per_chunk == 1
    with pytest.raises(ValueError, match="too small for one request's compressor state"):
        plan(spec, 1 << 26, 4, 256, chunk_pages=1)


def byte_ranges(lay):
    """Every (page-0) byte range of every region of one SWA page and one compress-owned chunk."""
    spec = lay.spec
    swa, comp = [], []
    for layer in range(spec.num_layers):
        r = lay.swa_rows(layer)
        swa.append((r.offset, r.offset + spec.block_size * r.row_bytes, f"swa L{layer}"))
    for layer in spec.csa_layers:
        st = lay.csa_state(layer)
        swa.append((st.offset, st.offset + spec.csa_state_bytes, f"csa L{layer}"))
    for layer in spec.compressed_layers:
        r = lay.compressed_rows(layer)
        comp.append((r.offset, r.offset + lay.compress_pages_per_chunk * r.used_rows * r.row_bytes, f"comp L{layer}"))
    for layer in spec.csa_layers:
        r = lay.index_rows(layer)
        comp.append((r.offset, r.offset + lay.compress_pages_per_chunk * r.used_rows * r.row_bytes, f"idx L{layer}"))
    return sorted(swa), sorted(comp)


@pytest.mark.parametrize("spec", [real_spec("deepseek_v4_flash"), real_spec("deepseek_v4_pro", "bf16"), tiny_spec()],
                         ids=["flash-fp8", "pro-bf16", "tiny-fp32"])
def test_regions_inside_a_page_and_a_chunk_never_overlap_and_stay_inside(spec):
    lay = plan(spec, 40 * GIB, 8, 4096)
    swa, comp = byte_ranges(lay)
    for ranges, limit in ((swa, lay.swa_page_bytes), (comp, lay.chunk_bytes)):
        for (a0, a1, an), (b0, b1, bn) in zip(ranges, ranges[1:]):
            assert a1 <= b0, f"{an} overlaps {bn}"
        assert ranges[-1][1] <= limit
        assert all(start % 8 == 0 for start, _, _ in ranges)


def test_row_strides_divide_pages_and_chunks_so_2d_row_views_are_exact():
    lay = plan(real_spec("deepseek_v4_flash"), 40 * GIB, 64, 1 << 20)
    assert lay.swa_page_bytes % 584 == 0 and lay.chunk_bytes % 584 == 0 and lay.chunk_bytes % 132 == 0
    r = lay.swa_rows(2)
    assert r.page_rows * 584 == lay.swa_page_bytes and r.page_rows != lay.spec.block_size
    # page 4 (chunk 1, local 1), slot 5: byte = page * page_bytes + layer offset + slot * row
    assert r.offset + r.row(4, 5) * 584 == 4 * lay.swa_page_bytes + 2 * 128 * 584 + 5 * 584
    c = lay.compressed_rows(2)
    k = lay.compress_pages_per_chunk
    assert c.offset + c.row(k + 2, 7) * 584 == lay.chunk_bytes + c.offset + (2 * 32 + 7) * 584


def test_tiny_geometry_block_size_is_the_lcm_of_its_ratios():
    spec = tiny_spec()
    assert spec.block_size == 16 and spec.entries_per_block(1) == 4 and spec.entries_per_block(2) == 1
    groups = plan(spec, 1 << 24, 4, 256).group_specs()
    assert sorted(groups) == ["c16", "c4", "dense"]
    assert groups["c4"].layers == (1, 3, 5) and len(groups["c4"].csa_state_offs) == 3
    assert groups["dense"].compressed_offsets == ()


def test_a_budget_that_cannot_hold_one_max_length_request_says_how_much_is_needed():
    spec = real_spec("deepseek_v4_flash")
    with pytest.raises(InsufficientKvMemory, match=r"needs at least \d+ B \(\d+\.\d+ GiB\)"):
        plan(spec, 1 * GIB, 64, 1 << 20)


@pytest.mark.parametrize("config,field,value", [(CacheConfig, "kv_cache_bytes", -5), (CacheConfig, "kv_cache_bytes", 2.5),
                                                (SchedulerConfig, "max_model_len", 0),
                                                (SchedulerConfig, "max_num_seqs", "8")])
def test_negative_or_non_integer_sizes_raise_value_error(config, field, value):
    with pytest.raises(ValueError, match=field):
        config(**{field: value})


def test_a_layout_for_a_chunk_count_is_the_plan_for_its_budget():
    limits = SchedulerConfig(max_num_seqs=2, max_model_len=64)
    lay = KvLayout.for_chunks(tiny_spec(), 7, limits)
    assert lay.num_chunks == 7
    assert plan_kv_layout(tiny_spec(), CacheConfig(kv_cache_bytes=lay.kv_cache_bytes), limits) == lay
    assert plan_kv_layout(tiny_spec(), CacheConfig(kv_cache_bytes=lay.kv_cache_bytes - 1), limits).num_chunks == 6
    assert lay.kv_cache_bytes == 7 * lay.chunk_bytes


def test_a_cache_block_size_other_than_the_specs_is_rejected():
    with pytest.raises(ValueError, match="block_size=32 but the KV spec"):
        plan_kv_layout(tiny_spec(), CacheConfig(block_size=32), SchedulerConfig())
