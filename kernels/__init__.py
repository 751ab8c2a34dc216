"""Kernels: one file per kernel (Triton body, checked wrapper, torch reference). See docs/kernels.md.

``swa_write``, ``compressed_write``, ``compressor_state``, ``paged_index``, ``sparse_attention``,
``fp8_ds_mla``; ``backend`` chooses the implementation (aiter / Triton / torch reference).
Nothing is imported here, so ``import atom.kernels`` stays cheap.
"""
