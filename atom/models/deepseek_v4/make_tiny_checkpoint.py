"""Write a random, seeded tiny DeepSeek-V4 checkpoint in the release format.

Usage: ``python -m atom.models.deepseek_v4.make_tiny_checkpoint OUT_DIR [--seed N] [--fp8] [--shards K]``.
The result loads with ``load_checkpoint(OUT_DIR)``; the same seed always gives the same weights.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from .checkpoint import random_state_dict, save_checkpoint
from .config import DeepseekV4Config


def make_tiny_checkpoint(out_dir: str | Path, *, seed: int = 0, fp8: bool = False, shards: int = 1) -> Path:
    """Write ``DeepseekV4Config.tiny()`` with ``random_state_dict(cfg, seed)`` to ``out_dir``."""
    cfg = DeepseekV4Config.tiny()
    return save_checkpoint(out_dir, cfg, random_state_dict(cfg, seed), fp8=fp8, shards=shards)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--fp8", action="store_true", help="store linears as FP8 e4m3 + e8m0 block scales")
    parser.add_argument("--shards", type=int, default=1, help="number of safetensors shards (index if > 1)")
    args = parser.parse_args(argv)
    path = make_tiny_checkpoint(args.out_dir, seed=args.seed, fp8=args.fp8, shards=args.shards)
    print(f"wrote tiny DeepSeek-V4 checkpoint to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
