"""The simulator's cost model: the KV bytes a token reads, the calibration, and the host-copy overlap."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from atom.bench.sim_cost import (SGLANG_H200_FLASH_FP8, CostModel, KvReads, PublishedRun, StepClock, calibrated,
                                 model_for, preset_reads)

TOY = KvReads(layers=3, csa_layers=1, hca_layers=1, window=8, top_k=3, csa_ratio=4, hca_ratio=16, row_bytes=10,
              key_bytes=2)


def brute_bytes(r: KvReads, pos: int) -> int:
    q = pos + 1
    rows = r.layers * min(q, r.window) + r.csa_layers * min(r.top_k, q // r.csa_ratio) + r.hca_layers * (q // r.hca_ratio)
    return rows * r.row_bytes + r.csa_layers * (q // r.csa_ratio) * r.key_bytes


def test_a_token_reads_its_window_the_top_k_the_indexer_keys_and_every_hca_row():
    # pos 39 sees 40 tokens: window 8 rows x 3 layers, top-k min(3, 10) = 3, 10 indexer keys, 40 // 16 = 2 HCA rows
    assert TOY.at(39) == (3 * 8 + 3 + 2) * 10 + 10 * 2
    assert TOY.at(0) == 3 * 1 * 10


def test_the_closed_form_sum_equals_the_sum_over_positions():
    for start in (0, 1, 7, 8, 15, 33, 100):
        for count in (0, 1, 5, 16, 64, 300):
            assert TOY.bytes_read(start, count) == sum(brute_bytes(TOY, p) for p in range(start, start + count))
    flash = preset_reads("deepseek_v4_flash")
    assert flash.bytes_read(8000, 300) == sum(brute_bytes(flash, p) for p in range(8000, 8300))


def test_flash_reads_the_bytes_of_its_geometry():
    flash = preset_reads("deepseek_v4_flash")
    assert (flash.layers, flash.csa_layers, flash.hca_layers, flash.window, flash.top_k) == (44, 21, 20, 128, 512)
    assert (flash.row_bytes, flash.key_bytes) == (584, 132)
    # at position 8191: 44 windows of 128 rows, 21 x 512 top-k rows, 20 x 64 HCA rows, 21 x 2048 keys
    assert flash.at(8191) == (44 * 128 + 21 * 512 + 20 * 64) * 584 + 21 * 2048 * 132


def test_the_calibrated_model_costs_a_published_request_the_gpu_time_its_throughput_implies():
    run = SGLANG_H200_FLASH_FP8
    reads = preset_reads("deepseek_v4_flash")
    m = calibrated(reads)
    tokens = run.input_len + run.output_len
    steps = tokens / run.tokens_per_step
    request_s = steps * m.step_s + tokens * m.token_s + reads.bytes_read(0, tokens) / m.attn_bytes_per_s
    assert request_s == pytest.approx(tokens / run.tokens_per_s_per_gpu, rel=1e-12)
    assert run.tokens_per_step == pytest.approx(584.1, abs=0.1)
    assert m.token_s == pytest.approx(238.86e-6, rel=1e-3)


def test_a_calibration_that_leaves_no_time_for_the_gemms_is_refused():
    fast = PublishedRun("a made-up run", 8192, 1024, 1e9, 0.1)
    with pytest.raises(ValueError, match="exceed"):
        calibrated(TOY, run=fast)


def test_pro_scales_the_flash_gemm_cost_by_active_parameters():
    flash, pro = model_for("deepseek_v4_flash"), model_for("deepseek_v4_pro")
    assert pro.token_s == pytest.approx(flash.token_s * 49 / 13)
    assert model_for("deepseek_v4_flash", token_s=40e-6).token_s == 40e-6


@pytest.mark.parametrize("field, value", [("step_s", -1.0), ("token_s", -1e-6), ("attn_bytes_per_s", 0.0),
                                          ("pcie_bytes_per_s", 0.0)])
def test_a_cost_model_refuses_a_negative_cost_or_a_zero_bandwidth(field, value):
    with pytest.raises(ValueError, match=field):
        CostModel(**{field: value})


def HostCopy(owner: str, src_pages: tuple, dst_pages: tuple) -> SimpleNamespace:
    """A copy order as the batch contract carries it (owner, source pages, destination pages)."""
    return SimpleNamespace(owner=owner, src_pages=src_pages, dst_pages=dst_pages)


def _batch(tokens: int, loads: tuple = (), stores: tuple = ()):
    seqs = (SimpleNamespace(start_pos=0, num_tokens=tokens),)
    return SimpleNamespace(seqs=seqs, num_tokens=tokens, host_loads=loads, host_stores=stores)


def test_host_copies_overlap_the_previous_step_and_the_step_waits_for_the_rest():
    cost = CostModel(step_s=0.01, token_s=0.0, pcie_bytes_per_s=1000.0)
    clock = StepClock(cost, {"swa": 100, "compress": 10})
    assert clock.step(_batch(4)) == pytest.approx(0.01)
    # 3 SWA pages in (300 B = 0.3 s) and 5 compressed pages out (50 B, the other direction): 0.3 s of copy,
    # 0.01 s of it hidden behind the previous step's compute
    loads = (HostCopy("swa", (1, 2, 3), (4, 5, 6)),)
    stores = (HostCopy("compress", (1, 2, 3, 4, 5), (0, 1, 2, 3, 4)),)
    assert clock.step(_batch(4, loads, stores)) == pytest.approx(0.01 + 0.29)
    assert (clock.bytes_in, clock.bytes_out) == (300, 50)
    assert clock.copy_wait_s == pytest.approx(0.29)
    small = (HostCopy("compress", (7,), (8,)),)  # 10 B = 0.01 s: hidden entirely
    assert clock.step(_batch(4, small)) == pytest.approx(0.01)
