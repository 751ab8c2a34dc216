"""The compiled page-copy kernel against its torch reference on a GPU, at V4-Flash page sizes.

Skipped on machines without CUDA/ROCm. Run in its own session (``pytest tests/gpu``): the CPU kernel tests
set ``TRITON_INTERPRET=1`` for the whole process, and these tests must exercise compiled code.
"""

import pytest
import torch

from support.gpu import gpu_module_marks

pytestmark = gpu_module_marks("tests/kernels/test_page_copy.py covers the same kernel in the interpreter")

DEV = "cuda"
FLASH_SWA_PAGE, FLASH_COMPRESSED_PAGE = 4149248, 492832  # DeepseekV4Config flash kv_spec() block bytes


@pytest.mark.parametrize("page_bytes, pitch", [(FLASH_COMPRESSED_PAGE, FLASH_COMPRESSED_PAGE),
                                                (FLASH_SWA_PAGE, FLASH_SWA_PAGE + 64), (1001, 1003)])
def test_copy_pages_equals_the_reference_on_scattered_pages(page_bytes, pitch):
    from atom.kernels.page_copy import copy_pages, copy_pages_reference

    gen = torch.Generator(device=DEV).manual_seed(3)
    n_src, n_dst, n = 24, 20, 17
    src_buf = torch.randint(0, 256, (n_src * pitch,), generator=gen, device=DEV, dtype=torch.uint8)
    src = src_buf.view(n_src, pitch)[:, :page_bytes]
    got_buf = torch.randint(0, 256, (n_dst * pitch,), generator=gen, device=DEV, dtype=torch.uint8)
    want_buf = got_buf.clone()
    got, want = (b.view(n_dst, pitch)[:, :page_bytes] for b in (got_buf, want_buf))
    src_pages = torch.randint(0, n_src, (n,), generator=gen, device=DEV)
    dst_pages = torch.randperm(n_dst, generator=gen, device=DEV)[:n]
    copy_pages(src, src_pages, got, dst_pages)
    copy_pages_reference(src, src_pages, want, dst_pages)
    assert torch.equal(got_buf, want_buf)
    assert torch.equal(got[dst_pages], src[src_pages])
