"""The capacity report meets its acceptance figures and ends with its summary line."""

import re

from atom.bench import capacity

GIB = 1 << 30


def test_the_arena_is_within_three_percent_of_the_oracle_and_never_below_atom_style(capsys):
    assert capacity.main(["--budget-gib", "40"]) == 0
    out = capsys.readouterr().out
    last = out.strip().splitlines()[-1]
    m = re.fullmatch(r"capacity_vs_oracle_min=([\d.]+) vs_atom_style_min=([\d.]+) vs_fixed_split_min=([\d.]+)", last)
    assert m, last
    oracle, atom, fixed = map(float, m.groups())
    assert oracle >= 0.97 and atom >= 1.0 and fixed >= 1.0


def test_each_fp8_geometry_row_is_within_three_percent_of_the_oracle():
    for preset in ("deepseek_v4_flash", "deepseek_v4_pro"):
        rep = capacity.report_geometry(preset, "fp8_ds_mla", 40 * GIB, 64)
        for mix, arena, fixed, atom, oracle in rep.rows:
            assert arena >= 0.97 * oracle, (preset, mix)
            assert arena >= atom, (preset, mix)


def test_chunked_capacity_counts_chunk_granularity_exactly():
    # 10 chunks, 2 SWA or 5 compressed pages per chunk: half SWA -> n/2 SWA in ceil(n/4) chunks
    assert capacity.chunked_capacity(0.0, 10, 2, 5) == 50
    assert capacity.chunked_capacity(1.0, 10, 2, 5) == 20
    assert capacity.chunked_capacity(0.5, 10, 2, 5) == 29  # 14 SWA (7 chunks) + 15 compressed (3 chunks)


def test_live_requests_hold_state_pages_and_every_count_beats_the_old_reservation():
    rep = capacity.report_geometry("deepseek_v4_flash", "fp8_ds_mla", 10 * GIB, 256)
    lay = rep.layout
    assert capacity.ring_state_bytes(lay.spec) == 21 * 80 * 1024 + 20 * 512 * 1024  # the 11.6 MiB of before
    assert [r.live for r in rep.live_rows] == [1, 16, 256]
    assert [r.state_bytes // lay.chunk_bytes for r in rep.live_rows] == [1, 3, 43]  # 6 request states per chunk
    assert all(r.reserved_bytes == 256 * capacity.ring_state_bytes(lay.spec) for r in rep.live_rows)
    now = [r.tokens_now for r in rep.live_rows]
    assert now == sorted(now, reverse=True) and all(r.tokens_now > r.tokens_before for r in rep.live_rows)
