"""Live compressor state rings and the CSA boundary state kept inside SWA pages.

Three kernels, each a checked Triton wrapper plus a torch reference of the same signature:

* :func:`compressor_state_update` writes each token's fp32 ``kv`` row and ``score + ape[pos % ratio]``
  row into its request's ring at ``pos % ring`` (CSA: ring ``CSA_STATE_RING`` = 8, width 2c; HCA:
  ring = ratio, width c; :mod:`atom.kv_group` holds these facts).
  Only the last ``ring`` tokens of each sequence's chunk are written: earlier ones would be overwritten
  inside the same chunk, and writing them in parallel would race on the same ring row.
* :func:`csa_boundary_capture` stores, for every token with ``pos % block_size >= block_size - 4``,
  the same two rows into row ``pos % block_size - (block_size - 4)`` of SWA page
  ``capture_table[s, pos // block_size]`` (the fp32 ``[num_swa_pages, 4, width]`` boundary views).
  It reads the token's own projected rows rather than the ring, because a chunk that crosses
  several block boundaries keeps only its last ``ring`` positions in the ring; the values are the
  ones the update writes (same fp32 add), so capture then restore is bit-exact.
* :func:`csa_state_write` is the update and the capture of one chunk in one launch (the serving
  attention's CSA path runs both on the same rows): each token's program writes its ring row when it is
  among its sequence's last ``ring`` tokens and its boundary row when its position is among a block's
  last 4. The capture's positions may be shifted by whole blocks (``capture_start``: the capture
  table's first column is the chunk's first block), so the ring's ``pos_start`` is a separate input.
* :func:`csa_boundary_restore` copies the 4 rows of SWA page ``restore_src[s]`` into state slot
  ``state_slot[s]`` at ring rows ``(P - 4 + j) % ring`` (``P`` = resume position), before the first
  compression after a prefix hit.

Call each once for the main compressor and once for the indexer's compressor (same tables).
Sentinels: -1 in ``state_slot``, ``capture_table`` or ``restore_src`` means skip; a -1 is never
turned into slot or page 0.
"""

from __future__ import annotations

import torch

from atom.kv_group import CSA_OVERLAP_ROWS  # rows of the CSA boundary state per SWA page: positions B-4 .. B-1

from ._common import (HAS_TRITON, check_index, check_positive, check_range, check_rows, check_same_device,
                      launch_tiles, masked_puts, require_triton, triton, tl, value_checks_enabled)
from .swa_write import check_ragged, ragged_tokens

__all__ = ["compressor_state_update", "compressor_state_update_ref", "csa_boundary_capture",
           "csa_boundary_capture_ref", "csa_state_write", "csa_state_write_ref", "csa_boundary_restore",
           "csa_boundary_restore_ref", "CSA_OVERLAP_ROWS"]


# ----------------------------------------------------------------------------------------------
# checks
# ----------------------------------------------------------------------------------------------

def _check_inputs(kv, score, ape) -> int:
    check_rows("kv", kv, dtype=torch.float32)
    check_rows("score", score, dtype=torch.float32, width=kv.shape[1])
    if score.shape[0] != kv.shape[0]:
        raise ValueError(f"score has {score.shape[0]} rows, kv has {kv.shape[0]}")
    check_rows("ape", ape, dtype=torch.float32, width=kv.shape[1])
    check_positive("ape.shape[0] (the compress ratio)", ape.shape[0])
    return kv.shape[1]


def _check_state(kv_state, score_state, width) -> None:
    check_rows("kv_state", kv_state, ndim=3, dtype=torch.float32, width=width)
    check_rows("score_state", score_state, ndim=3, dtype=torch.float32, width=width)
    if kv_state.shape != score_state.shape:
        raise ValueError(f"kv_state {tuple(kv_state.shape)} and score_state {tuple(score_state.shape)} differ")


def _check_boundary(name_kv, kv_b, name_score, score_b, width) -> None:
    check_rows(name_kv, kv_b, ndim=3, dtype=torch.float32, width=width)
    check_rows(name_score, score_b, ndim=3, dtype=torch.float32, width=width)
    if kv_b.shape[1] != CSA_OVERLAP_ROWS or kv_b.shape != score_b.shape:
        raise ValueError(f"{name_kv} {tuple(kv_b.shape)} and {name_score} {tuple(score_b.shape)} must both be "
                         f"[num_swa_pages, {CSA_OVERLAP_ROWS}, {width}]")


def _check_update(kv, score, ape, kv_state, score_state, state_slot, cu_seqlens, pos_start) -> int:
    width = _check_inputs(kv, score, ape)
    _check_state(kv_state, score_state, width)
    check_same_device(kv=kv, score=score, ape=ape, kv_state=kv_state, score_state=score_state,
                      state_slot=state_slot, cu_seqlens=cu_seqlens, pos_start=pos_start)
    max_len = check_ragged(kv.shape[0], cu_seqlens, pos_start, 2**31 - 1)
    check_index("state_slot", state_slot, (cu_seqlens.shape[0] - 1,))
    check_range("state_slot", state_slot, -1, kv_state.shape[0], "a slot of kv_state, or -1 = skip")
    return max_len


def _check_capture(kv, score, ape, kv_dst, score_dst, capture_table, cu_seqlens, pos_start, block_size) -> int:
    width = _check_inputs(kv, score, ape)
    check_positive("block_size", block_size, CSA_OVERLAP_ROWS)
    _check_boundary("kv_dst", kv_dst, "score_dst", score_dst, width)
    check_same_device(kv=kv, score=score, ape=ape, kv_dst=kv_dst, score_dst=score_dst,
                      capture_table=capture_table, cu_seqlens=cu_seqlens, pos_start=pos_start)
    check_index("capture_table", capture_table, (cu_seqlens.shape[0] - 1, None))
    max_len = check_ragged(kv.shape[0], cu_seqlens, pos_start, capture_table.shape[1] * block_size)
    check_range("capture_table", capture_table, -1, kv_dst.shape[0], "an SWA page of kv_dst, or -1 = skip")
    return max_len


def _check_restore(kv_src, score_src, kv_state, score_state, restore_src, state_slot, resume_pos) -> None:
    check_rows("kv_src", kv_src, ndim=3, dtype=torch.float32)
    width = kv_src.shape[2]
    _check_boundary("kv_src", kv_src, "score_src", score_src, width)
    _check_state(kv_state, score_state, width)
    if kv_state.shape[1] < CSA_OVERLAP_ROWS:
        raise ValueError(f"kv_state ring has {kv_state.shape[1]} rows, fewer than {CSA_OVERLAP_ROWS}")
    check_same_device(kv_src=kv_src, score_src=score_src, kv_state=kv_state, score_state=score_state,
                      restore_src=restore_src, state_slot=state_slot, resume_pos=resume_pos)
    check_index("restore_src", restore_src, (None,))
    check_index("state_slot", state_slot, restore_src.shape)
    check_index("resume_pos", resume_pos, restore_src.shape)
    check_range("restore_src", restore_src, -1, kv_src.shape[0], "an SWA page of kv_src, or -1 = skip")
    check_range("state_slot", state_slot, -1, kv_state.shape[0], "a slot of kv_state, or -1 = skip")
    live = (restore_src >= 0) & (state_slot >= 0)
    check_range("resume_pos of restored sequences", resume_pos[live], CSA_OVERLAP_ROWS, 2**31 - 1,
                f"a restore needs the {CSA_OVERLAP_ROWS} positions before it")
    if value_checks_enabled() and bool((resume_pos[live] % CSA_OVERLAP_ROWS != 0).any()):
        raise ValueError(f"resume_pos of a restored sequence must be a multiple of {CSA_OVERLAP_ROWS} (a block boundary)")


# ----------------------------------------------------------------------------------------------
# torch references
# ----------------------------------------------------------------------------------------------

def compressor_state_update_ref(kv: torch.Tensor, score: torch.Tensor, ape: torch.Tensor, kv_state: torch.Tensor,
                                score_state: torch.Tensor, state_slot: torch.Tensor, cu_seqlens: torch.Tensor,
                                pos_start: torch.Tensor) -> None:
    """Torch reference of :func:`compressor_state_update` (same contract)."""
    _check_update(kv, score, ape, kv_state, score_state, state_slot, cu_seqlens, pos_start)
    ring = kv_state.shape[1]
    tok, seq, pos, keep = ragged_tokens(cu_seqlens, pos_start, ring, kv.shape[0])
    slot = state_slot[seq].long()
    keep = keep & (slot >= 0)
    masked_puts(((kv_state, kv[tok]), (score_state, score[tok] + ape[pos % ape.shape[0]])), (slot, pos % ring),
                keep)


def csa_boundary_capture_ref(kv: torch.Tensor, score: torch.Tensor, ape: torch.Tensor, kv_dst: torch.Tensor,
                             score_dst: torch.Tensor, capture_table: torch.Tensor, cu_seqlens: torch.Tensor,
                             pos_start: torch.Tensor, *, block_size: int) -> None:
    """Torch reference of :func:`csa_boundary_capture` (same contract)."""
    _check_capture(kv, score, ape, kv_dst, score_dst, capture_table, cu_seqlens, pos_start, block_size)
    first = block_size - CSA_OVERLAP_ROWS
    tok, seq, pos, _ = ragged_tokens(cu_seqlens, pos_start, None, kv.shape[0])
    page = capture_table[seq, pos // block_size].long()
    keep = (pos % block_size >= first) & (page >= 0)
    row = pos % block_size - first
    masked_puts(((kv_dst, kv[tok]), (score_dst, score[tok] + ape[pos % ape.shape[0]])), (page, row), keep)


def csa_state_write_ref(kv: torch.Tensor, score: torch.Tensor, ape: torch.Tensor, kv_state: torch.Tensor,
                        score_state: torch.Tensor, state_slot: torch.Tensor, kv_dst: torch.Tensor,
                        score_dst: torch.Tensor, capture_table: torch.Tensor, cu_seqlens: torch.Tensor,
                        pos_start: torch.Tensor, capture_start: torch.Tensor, *, block_size: int) -> None:
    """Torch reference of :func:`csa_state_write`: the update, then the capture (they write disjoint memory)."""
    compressor_state_update_ref(kv, score, ape, kv_state, score_state, state_slot, cu_seqlens, pos_start)
    csa_boundary_capture_ref(kv, score, ape, kv_dst, score_dst, capture_table, cu_seqlens, capture_start,
                             block_size=block_size)


def csa_boundary_restore_ref(kv_src: torch.Tensor, score_src: torch.Tensor, kv_state: torch.Tensor,
                             score_state: torch.Tensor, restore_src: torch.Tensor, state_slot: torch.Tensor,
                             resume_pos: torch.Tensor) -> None:
    """Torch reference of :func:`csa_boundary_restore` (same contract)."""
    _check_restore(kv_src, score_src, kv_state, score_state, restore_src, state_slot, resume_pos)
    live = ((restore_src >= 0) & (state_slot >= 0))[:, None].expand(-1, CSA_OVERLAP_ROWS).reshape(-1)
    ring = kv_state.shape[1]
    j = torch.arange(CSA_OVERLAP_ROWS, device=kv_src.device)[None, :]
    src = restore_src.long().clamp(min=0)[:, None]
    slot = state_slot.long()[:, None].expand(-1, CSA_OVERLAP_ROWS).reshape(-1)
    dst_row = ((resume_pos.long()[:, None] - CSA_OVERLAP_ROWS + j) % ring).reshape(-1)
    masked_puts(((kv_state, kv_src[src, j].flatten(0, 1)), (score_state, score_src[src, j].flatten(0, 1))),
                (slot, dst_row), live)


# ----------------------------------------------------------------------------------------------
# Triton
# ----------------------------------------------------------------------------------------------

if HAS_TRITON:
    from ._common import copy_rows

    @triton.jit
    def _put_kv_score(kv_ptr, score_ptr, ape_ptr, t, kv_stride, score_stride, ape_off, kv_dst_ptr,
                      score_dst_ptr, kv_dst_off, score_dst_off, ok, width, BLOCK_W: tl.constexpr):
        """kv_dst[row] = kv[t]; score_dst[row] = score[t] + ape[pos % ratio] (one fp32 add, as torch)."""
        copy_rows(kv_ptr, t * kv_stride, kv_dst_ptr, kv_dst_off, ok, width, BLOCK_W)
        src_off = t * score_stride
        for w0 in range(0, width, BLOCK_W):
            w = w0 + tl.arange(0, BLOCK_W)
            m = ok[:, None] & (w[None, :] < width)
            x = tl.load(score_ptr + src_off[:, None] + w[None, :], mask=m)
            a = tl.load(ape_ptr + ape_off[:, None] + w[None, :], mask=m)
            tl.store(score_dst_ptr + score_dst_off[:, None] + w[None, :], x + a, mask=m)

    @triton.jit
    def _capture_tile(kv_ptr, score_ptr, ape_ptr, kvd_ptr, sd_ptr, table_ptr, s, t, j, n, pos, width, kv_stride,
                      score_stride, ape_stride, kvd_s0, kvd_s1, sd_s0, sd_s1, table_stride, block_size, ratio,
                      OVERLAP: tl.constexpr, BLOCK_W: tl.constexpr):
        """Sequence ``s``'s tokens ``t`` (tile offsets ``j`` of its ``n``, positions ``pos``) that fall in the last
        ``OVERLAP`` positions of a block: their rows (``ape`` added) into that block's capture page."""
        first = block_size - OVERLAP
        ok = (j < n) & (pos % block_size >= first)
        page = tl.load(table_ptr + s.to(tl.int64) * table_stride + pos // block_size, mask=ok, other=-1)
        ok = ok & (page >= 0)
        page = page.to(tl.int64)
        r = (pos % block_size - first).to(tl.int64)
        _put_kv_score(kv_ptr, score_ptr, ape_ptr, t, kv_stride, score_stride, (pos % ratio).to(tl.int64) * ape_stride,
                      kvd_ptr, sd_ptr, page * kvd_s0 + r * kvd_s1, page * sd_s0 + r * sd_s1, ok, width, BLOCK_W)

    @triton.jit
    def _update_kernel(kv_ptr, score_ptr, ape_ptr, kvs_ptr, ss_ptr, slot_ptr, cu_ptr, pstart_ptr, width,
                       kv_stride, score_stride, ape_stride, kvs_s0, kvs_s1, ss_s0, ss_s1, ring, ratio,
                       BLOCK_T: tl.constexpr, BLOCK_W: tl.constexpr):
        s = tl.program_id(0)
        start = tl.load(cu_ptr + s)
        n = tl.load(cu_ptr + s + 1) - start
        slot = tl.load(slot_ptr + s).to(tl.int64)
        j = tl.maximum(n - ring, 0) + tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
        ok = (j < n) & (slot >= 0)
        pos = tl.load(pstart_ptr + s) + j
        t = (start + j).to(tl.int64)
        r = (pos % ring).to(tl.int64)
        _put_kv_score(kv_ptr, score_ptr, ape_ptr, t, kv_stride, score_stride, (pos % ratio).to(tl.int64) * ape_stride,
                      kvs_ptr, ss_ptr, slot * kvs_s0 + r * kvs_s1, slot * ss_s0 + r * ss_s1, ok, width, BLOCK_W)

    @triton.jit
    def _capture_kernel(kv_ptr, score_ptr, ape_ptr, kvd_ptr, sd_ptr, table_ptr, cu_ptr, pstart_ptr, width,
                        kv_stride, score_stride, ape_stride, kvd_s0, kvd_s1, sd_s0, sd_s1, table_stride, block_size,
                        ratio, OVERLAP: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_W: tl.constexpr):
        s = tl.program_id(0)
        start = tl.load(cu_ptr + s)
        n = tl.load(cu_ptr + s + 1) - start
        j = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
        pos = tl.load(pstart_ptr + s) + j
        _capture_tile(kv_ptr, score_ptr, ape_ptr, kvd_ptr, sd_ptr, table_ptr, s, (start + j).to(tl.int64), j, n, pos,
                      width, kv_stride, score_stride, ape_stride, kvd_s0, kvd_s1, sd_s0, sd_s1, table_stride,
                      block_size, ratio, OVERLAP, BLOCK_W)

    @triton.jit
    def _state_write_kernel(kv_ptr, score_ptr, ape_ptr, kvs_ptr, ss_ptr, slot_ptr, kvd_ptr, sd_ptr, table_ptr, cu_ptr,
                            pstart_ptr, cstart_ptr, width, kv_stride, score_stride, ape_stride, kvs_s0, kvs_s1, ss_s0,
                            ss_s1, kvd_s0, kvd_s1, sd_s0, sd_s1, table_stride, ring, ratio, block_size,
                            OVERLAP: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_W: tl.constexpr):
        """``_update_kernel`` and ``_capture_kernel`` of one token tile: the same writes, one launch."""
        s = tl.program_id(0)
        start = tl.load(cu_ptr + s)
        n = tl.load(cu_ptr + s + 1) - start
        j = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
        t = (start + j).to(tl.int64)
        slot = tl.load(slot_ptr + s).to(tl.int64)
        pos = tl.load(pstart_ptr + s) + j
        ok = (j < n) & (j >= n - ring) & (slot >= 0)  # the ring keeps the chunk's last `ring` tokens
        r = (pos % ring).to(tl.int64)
        _put_kv_score(kv_ptr, score_ptr, ape_ptr, t, kv_stride, score_stride, (pos % ratio).to(tl.int64) * ape_stride,
                      kvs_ptr, ss_ptr, slot * kvs_s0 + r * kvs_s1, slot * ss_s0 + r * ss_s1, ok, width, BLOCK_W)
        cpos = tl.load(cstart_ptr + s) + j
        _capture_tile(kv_ptr, score_ptr, ape_ptr, kvd_ptr, sd_ptr, table_ptr, s, t, j, n, cpos, width, kv_stride,
                      score_stride, ape_stride, kvd_s0, kvd_s1, sd_s0, sd_s1, table_stride, block_size, ratio,
                      OVERLAP, BLOCK_W)

    @triton.jit
    def _restore_kernel(kvs_ptr, ss_ptr, kvd_ptr, sd_ptr, src_ptr, slot_ptr, rpos_ptr, width, kvs_s0, kvs_s1,
                        ss_s0, ss_s1, kvd_s0, kvd_s1, sd_s0, sd_s1, ring, OVERLAP: tl.constexpr,
                        BLOCK_W: tl.constexpr):
        s = tl.program_id(0)
        page = tl.load(src_ptr + s).to(tl.int64)
        slot = tl.load(slot_ptr + s).to(tl.int64)
        j = tl.arange(0, OVERLAP)
        ok = (j < OVERLAP) & (page >= 0) & (slot >= 0)
        r = ((tl.load(rpos_ptr + s) - OVERLAP + j) % ring).to(tl.int64)
        copy_rows(kvs_ptr, page * kvs_s0 + j * kvs_s1, kvd_ptr, slot * kvd_s0 + r * kvd_s1, ok, width, BLOCK_W)
        copy_rows(ss_ptr, page * ss_s0 + j * ss_s1, sd_ptr, slot * sd_s0 + r * sd_s1, ok, width, BLOCK_W)


def compressor_state_update(kv: torch.Tensor, score: torch.Tensor, ape: torch.Tensor, kv_state: torch.Tensor,
                            score_state: torch.Tensor, state_slot: torch.Tensor, cu_seqlens: torch.Tensor,
                            pos_start: torch.Tensor) -> None:
    """Write the chunk's last ``ring`` tokens of each sequence into its compressor ring.

    Args:
        kv, score: fp32 ``[num_tokens, width]`` pre-pool projections of the chunk's tokens.
        ape: fp32 ``[ratio, width]`` learned positional bias, added as ``ape[pos % ratio]``.
        kv_state, score_state: fp32 ``[num_slots, ring, width]`` live state (inner dim contiguous).
        state_slot: int32 ``[num_seqs]`` state slot per sequence, -1 = skip.
        cu_seqlens: int32 ``[num_seqs + 1]`` token offsets; pos_start: int32 ``[num_seqs]``.
    """
    max_len = _check_update(kv, score, ape, kv_state, score_state, state_slot, cu_seqlens, pos_start)
    require_triton("compressor_state_update")
    ring = kv_state.shape[1]
    span = min(max_len, ring)
    if span == 0:
        return
    bt, bw = launch_tiles(kv.device, kv.shape[1])
    grid = (state_slot.shape[0], triton.cdiv(span, bt))
    _update_kernel[grid](kv, score, ape, kv_state, score_state, state_slot, cu_seqlens, pos_start, kv.shape[1],
                         kv.stride(0), score.stride(0), ape.stride(0), kv_state.stride(0), kv_state.stride(1),
                         score_state.stride(0), score_state.stride(1), ring, ape.shape[0], BLOCK_T=bt, BLOCK_W=bw)


def csa_boundary_capture(kv: torch.Tensor, score: torch.Tensor, ape: torch.Tensor, kv_dst: torch.Tensor,
                         score_dst: torch.Tensor, capture_table: torch.Tensor, cu_seqlens: torch.Tensor,
                         pos_start: torch.Tensor, *, block_size: int) -> None:
    """Store the overlap rows of every block-final 4 tokens of the chunk into their SWA page.

    Args:
        kv, score, ape, cu_seqlens, pos_start: as in :func:`compressor_state_update`.
        kv_dst, score_dst: fp32 ``[num_swa_pages, 4, width]`` boundary views (page stride arbitrary).
        capture_table: int32 ``[num_seqs, max_blocks]`` SWA page of each logical block, -1 = skip.
        block_size: tokens per logical block (>= 4).
    """
    max_len = _check_capture(kv, score, ape, kv_dst, score_dst, capture_table, cu_seqlens, pos_start, block_size)
    require_triton("csa_boundary_capture")
    if max_len == 0:
        return
    bt, bw = launch_tiles(kv.device, kv.shape[1])
    grid = (capture_table.shape[0], triton.cdiv(max_len, bt))
    _capture_kernel[grid](kv, score, ape, kv_dst, score_dst, capture_table, cu_seqlens, pos_start, kv.shape[1],
                          kv.stride(0), score.stride(0), ape.stride(0), kv_dst.stride(0), kv_dst.stride(1),
                          score_dst.stride(0),
                          score_dst.stride(1), capture_table.stride(0), block_size, ape.shape[0],
                          OVERLAP=CSA_OVERLAP_ROWS, BLOCK_T=bt, BLOCK_W=bw)


def csa_state_write(kv: torch.Tensor, score: torch.Tensor, ape: torch.Tensor, kv_state: torch.Tensor,
                    score_state: torch.Tensor, state_slot: torch.Tensor, kv_dst: torch.Tensor, score_dst: torch.Tensor,
                    capture_table: torch.Tensor, cu_seqlens: torch.Tensor, pos_start: torch.Tensor,
                    capture_start: torch.Tensor, *, block_size: int) -> None:
    """:func:`compressor_state_update` and :func:`csa_boundary_capture` of the same chunk in one launch.

    Args:
        kv, score, ape, kv_state, score_state, state_slot, cu_seqlens, pos_start: the update's.
        kv_dst, score_dst, capture_table, block_size: the capture's; ``capture_start``: int32 ``[num_seqs]`` its
            ``pos_start`` (the ring's moved back by whole blocks to the capture table's first column, or equal).
    """
    _check_update(kv, score, ape, kv_state, score_state, state_slot, cu_seqlens, pos_start)
    max_len = _check_capture(kv, score, ape, kv_dst, score_dst, capture_table, cu_seqlens, capture_start, block_size)
    check_index("capture_start", capture_start, tuple(pos_start.shape))
    require_triton("csa_state_write")
    if max_len == 0:
        return
    bt, bw = launch_tiles(kv.device, kv.shape[1])
    grid = (capture_table.shape[0], triton.cdiv(max_len, bt))
    _state_write_kernel[grid](
        kv, score, ape, kv_state, score_state, state_slot, kv_dst, score_dst, capture_table, cu_seqlens, pos_start,
        capture_start, kv.shape[1], kv.stride(0), score.stride(0), ape.stride(0), kv_state.stride(0),
        kv_state.stride(1), score_state.stride(0), score_state.stride(1), kv_dst.stride(0), kv_dst.stride(1),
        score_dst.stride(0), score_dst.stride(1), capture_table.stride(0), kv_state.shape[1], ape.shape[0],
        block_size, OVERLAP=CSA_OVERLAP_ROWS, BLOCK_T=bt, BLOCK_W=bw)


def csa_boundary_restore(kv_src: torch.Tensor, score_src: torch.Tensor, kv_state: torch.Tensor,
                         score_state: torch.Tensor, restore_src: torch.Tensor, state_slot: torch.Tensor,
                         resume_pos: torch.Tensor) -> None:
    """Copy the 4 boundary rows of page ``restore_src[s]`` into ring rows ``(P-4+j) % ring`` of ``state_slot[s]``.

    Args:
        kv_src, score_src: fp32 ``[num_swa_pages, 4, width]`` boundary views.
        kv_state, score_state: fp32 ``[num_slots, ring, width]`` live state.
        restore_src, state_slot: int32 ``[n]``; -1 in either = skip. resume_pos: int32 ``[n]`` = P,
            a multiple of 4 and >= 4 for every restored sequence.
    """
    _check_restore(kv_src, score_src, kv_state, score_state, restore_src, state_slot, resume_pos)
    require_triton("csa_boundary_restore")
    if restore_src.shape[0] == 0:
        return
    _, bw = launch_tiles(kv_src.device, kv_src.shape[2])
    _restore_kernel[(restore_src.shape[0],)](
        kv_src, score_src, kv_state, score_state, restore_src, state_slot, resume_pos, kv_src.shape[2],
        kv_src.stride(0), kv_src.stride(1), score_src.stride(0), score_src.stride(1), kv_state.stride(0),
        kv_state.stride(1), score_state.stride(0), score_state.stride(1), kv_state.shape[1],
        OVERLAP=CSA_OVERLAP_ROWS, BLOCK_W=bw)
