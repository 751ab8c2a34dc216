"""Kernels: one file per kernel (Triton body, checked wrapper, torch reference)."""
