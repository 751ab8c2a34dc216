"""The capacity the runner binds is the capacity the capacity report prints: the fp8 arena of V4-Flash and V4-Pro at
40 GiB, bound as byte row views on the meta device, addresses exactly the chunks the report counts (its KV tokens
plus the chunks its live requests' compressor state holds)."""

import pytest
import torch

from atom.bench import capacity
from atom.kernels._common import max_comp_page, max_swa_page
from atom.model_ops.kv_views import bind_kv_arena
from atom.models.deepseek_v4.config import DeepseekV4Config

GIB = 1 << 30


def addressable_tokens(views) -> tuple[int, int]:
    """(SWA tokens, compressed tokens) every layer's bound views can address, in whole blocks."""
    lay, spec = views.layout, views.layout.spec
    b = spec.block_size
    swa = min(max_swa_page(v.shape[0], b, lay.swa_rows(layer).page_rows) for layer, v in views.swa.items())
    comp = min(max_comp_page(v.shape[0], reg.used_rows, reg.pages_per_chunk, reg.chunk_rows)
               for kind, group in (("compressed", views.comp), ("index", views.index))
               for layer, v in group.items() for reg in [views.region(layer, kind)])
    return swa * b, comp * b


@pytest.mark.parametrize("preset", ["deepseek_v4_flash", "deepseek_v4_pro"])
def test_the_bound_fp8_arena_holds_what_the_capacity_report_prints_at_40_gib(preset):
    rep = capacity.report_geometry(preset, "fp8_ds_mla", 40 * GIB, 64)
    views = bind_kv_arena(rep.layout, device="meta")
    spec = rep.layout.spec
    lay, b = rep.layout, spec.block_size
    assert views.buffer.numel() == lay.arena_bytes <= 40 * GIB
    assert views.swa[0].dtype == torch.uint8 and views.swa[0].shape[1] == spec.main_row_bytes == 584
    assert views.index[spec.csa_layers[0]].shape[1] == spec.index_row_bytes == 132
    # every chunk is addressable as SWA or compressed pages; the report counts the chunks left for KV
    # once its 64 live requests' compressor state holds its pages
    assert addressable_tokens(views) == (lay.num_chunks * lay.chunk_pages * b,
                                         lay.num_chunks * lay.compress_pages_per_chunk * b)
    kv_chunks = lay.num_chunks - capacity.state_chunks(lay, 64)
    by_mix = {mix: arena for mix, arena, *_ in rep.rows}
    assert (by_mix[1.0], by_mix[0.0]) == (kv_chunks * lay.chunk_pages * b, kv_chunks * lay.compress_pages_per_chunk * b)


@pytest.mark.parametrize("preset", ["deepseek_v4_flash", "deepseek_v4_pro"])
def test_the_runners_fp8_spec_is_the_reports_geometry_without_the_unserved_mtp_layer(preset):
    cfg = DeepseekV4Config.from_preset(preset)
    served, reported = cfg.kv_spec("fp8_ds_mla", include_mtp=False), cfg.kv_spec("fp8_ds_mla")
    assert served.compress_ratios == reported.compress_ratios[:cfg.n_layers] and reported.num_mtp_layers == 1
    assert (served.main_row_bytes, served.index_row_bytes, served.fp8_block) == (584, 132, 64)
    assert (served.block_size, served.index_format) == (reported.block_size, "fp8")

