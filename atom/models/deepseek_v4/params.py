"""Parameter counts of a DeepSeek-V4 config, from a model built on the ``meta`` device (no memory allocated).

Experts are counted at their logical size (FP4-packed release weights count as their unpacked element count).
``python -m atom.models.deepseek_v4.params [flash|pro|tiny|CONFIG.json]`` prints the table.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

import torch

from atom.config import load_hf_config

from .config import DeepseekV4Config
from .model import DeepseekV4Model


@dataclass(frozen=True)
class ParamCounts:
    """Element counts.  ``total`` = the main model (the published 284B / 1.6T figures exclude MTP);
    ``total_with_mtp`` adds the MTP block; ``activated`` = what one main-model token touches (non-embedding)."""

    total: int
    total_with_mtp: int
    embedding: int
    head: int
    attention: int
    routed_experts: int
    shared_experts: int
    mtp: int
    other: int
    activated: int


def meta_model(cfg: DeepseekV4Config) -> DeepseekV4Model:
    """The model on the ``meta`` device: shapes only, no storage."""
    return DeepseekV4Model(cfg, dtype=torch.bfloat16, device="meta")


def count_parameters(cfg: DeepseekV4Config) -> ParamCounts:
    """Count every tensor of the official state dict (buffers such as ``tid2eid`` excluded)."""
    parts = dict(embedding=0, head=0, attention=0, routed_experts=0, shared_experts=0, mtp=0, other=0)
    for name, p in meta_model(cfg).named_parameters():
        n = p.numel()
        if name.startswith("mtp."):
            parts["mtp"] += n
        elif name == "embed.weight":
            parts["embedding"] += n
        elif name == "head.weight":
            parts["head"] += n
        elif ".attn." in name:
            parts["attention"] += n
        elif ".ffn.experts." in name:
            parts["routed_experts"] += n
        elif ".ffn.shared_experts." in name:
            parts["shared_experts"] += n
        else:
            parts["other"] += n
    with_mtp = sum(parts.values())
    total = with_mtp - parts["mtp"]
    unused = parts["routed_experts"] * (cfg.n_routed_experts - cfg.n_activated_experts) // cfg.n_routed_experts
    activated = total - unused - parts["embedding"]
    return ParamCounts(total=total, total_with_mtp=with_mtp, activated=activated, **parts)


def load_config(name: str) -> DeepseekV4Config:
    """``flash`` / ``pro`` (the committed release configs), ``tiny``, or a path to a ``config.json``."""
    if name == "tiny":
        return DeepseekV4Config.tiny()
    if name in ("flash", "pro"):
        return DeepseekV4Config.from_preset(f"deepseek_v4_{name}")
    return DeepseekV4Config.from_hf_dict(load_hf_config(name))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="DeepSeek-V4 parameter counts")
    parser.add_argument("config", nargs="*", default=["flash", "pro"])
    args = parser.parse_args(argv)
    for name in args.config:
        counts = count_parameters(load_config(name))
        print(f"{name}: total {counts.total / 1e9:.1f}B, activated {counts.activated / 1e9:.1f}B")
        for field, value in vars(counts).items():
            print(f"  {field:16s} {value:>18,d}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
