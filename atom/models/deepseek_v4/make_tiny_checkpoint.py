"""Write a random, seeded tiny DeepSeek-V4 checkpoint directory in the release format.

Usage: ``python -m atom.models.deepseek_v4.make_tiny_checkpoint OUT_DIR [--seed N] [--fp8] [--fp4-experts]
[--shards K]``.  The directory is complete: ``config.json``, the safetensors (with an index when sharded) and
the built-in byte-level tokenizer (``tokenizer.json`` + ``tokenizer_config.json``), so ``atom serve OUT_DIR``
serves it.  ``--fp8`` stores the linears as FP8 e4m3 + e8m0 block scales, ``--fp4-experts`` the routed experts
as packed MXFP4 (int8 pairs + e8m0 per 32), as the release does.  The same seed always gives the same weights.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from .checkpoint import random_tensors, save_checkpoint
from .config import DeepseekV4Config


def make_tiny_checkpoint(out_dir: str | Path, *, seed: int = 0, fp8: bool = False, fp4_experts: bool = False,
                         shards: int = 1) -> Path:
    """Write ``DeepseekV4Config.tiny()`` with ``random_tensors(cfg, seed)`` and the tokenizer to ``out_dir``."""
    from atom.tokenizer import write_builtin_tokenizer

    cfg = DeepseekV4Config.tiny()
    path = save_checkpoint(out_dir, cfg, random_tensors(cfg, seed), fp8=fp8, fp4_experts=fp4_experts,
                           shards=shards)
    write_builtin_tokenizer(path)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fp8", action="store_true", help="store linears as FP8 e4m3 + e8m0 block scales")
    parser.add_argument("--fp4-experts", action="store_true",
                        help="store routed experts as packed MXFP4 (int8 e2m1 pairs + e8m0 scale per 32 inputs)")
    parser.add_argument("--shards", type=int, default=1, help="number of safetensors shards (index if > 1)")
    args = parser.parse_args(argv)
    if args.shards < 1:
        parser.error(f"--shards must be >= 1, got {args.shards}")
    path = make_tiny_checkpoint(args.out_dir, seed=args.seed, fp8=args.fp8, fp4_experts=args.fp4_experts,
                                shards=args.shards)
    print(f"wrote tiny DeepSeek-V4 checkpoint to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
