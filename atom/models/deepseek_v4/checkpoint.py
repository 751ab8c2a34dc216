"""Checkpoint I/O in the released DeepSeek-V4 format (dsv4_checkpoint_format.md).

A checkpoint directory holds ``config.json`` (HF keys) and one or more ``*.safetensors`` files (sharded ones are
listed in ``model.safetensors.index.json``).  Tensor names are the official ones (``embed.weight``,
``layers.3.attn.wq_a.weight``, ``mtp.0.e_proj.weight``; no ``model.`` prefix).  FP8 weights are e4m3 with a
sibling ``<name>.scale`` (e8m0, one per 128x128 block) and are dequantized to the model dtype on load.  The
release's MTP aliases of the shared embedding / head (``mtp.0.emb.tok_emb.weight``, ``mtp.0.head.weight``) are
accepted and ignored.  Anything else that does not match the model raises ``CheckpointError`` naming the tensors.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from .config import DeepseekV4Config
from .model import DeepseekV4Model
from .quant import dequantize_fp8_weight, quantize_fp8_weight

INDEX_FILE = "model.safetensors.index.json"
_IGNORED_ALIASES = ("mtp.0.emb.tok_emb.weight", "mtp.0.head.weight")
_F32 = re.compile(r"(^|\.)(hc_\w+|attn_sink|ape|bias)$")
_FP8 = re.compile(r"(attn\.(wq_a|wq_b|wkv|wo_a|wo_b)|indexer\.wq_b|experts\.\d+\.w[123]|shared_experts\.w[123]"
                  r"|e_proj|h_proj)\.weight$")


class CheckpointError(ValueError):
    """A checkpoint is incomplete, corrupted or does not match its config."""


def stored_dtype(name: str) -> torch.dtype:
    """The dtype a tensor is stored with (release convention): F32 for mHC / sink / ape / router bias, I64 for
    ``tid2eid``, BF16 for everything else."""
    if name.endswith("tid2eid"):
        return torch.int64
    return torch.float32 if _F32.search(name) else torch.bfloat16


def random_state_dict(cfg: DeepseekV4Config, seed: int = 0) -> dict[str, torch.Tensor]:
    """Seeded random fp32 weights for every model tensor; values are representable in their stored dtype, so a
    save/load round trip is exact."""
    gen = torch.Generator().manual_seed(seed)
    shapes = {k: tuple(v.shape) for k, v in DeepseekV4Model(cfg, device="meta").state_dict().items()}
    out: dict[str, torch.Tensor] = {}
    for name in sorted(shapes):
        shape = shapes[name]

        def randn(std: float, shape: tuple[int, ...] = shape) -> torch.Tensor:
            return torch.randn(shape, generator=gen) * std

        if name.endswith("tid2eid"):
            t = torch.stack([torch.randperm(cfg.n_routed_experts, generator=gen)[: shape[1]]
                             for _ in range(shape[0])])
        elif name.endswith("_scale") and name.split(".")[-1].startswith("hc_"):
            t = 0.5 + torch.rand(shape, generator=gen)
        elif name.endswith(("_base", "gate.bias")):
            t = randn(0.1)
        elif name.endswith("attn_sink"):
            t = randn(1.0)
        elif name.endswith("ape"):
            t = randn(0.5)
        elif name == "embed.weight":
            t = randn(1.0)
        elif len(shape) == 1:  # RMSNorm weights
            t = 1.0 + randn(0.1)
        else:
            t = randn(shape[1] ** -0.5)
        dtype = stored_dtype(name)
        out[name] = t if dtype == torch.int64 else t.to(dtype).float()
    return out


def save_checkpoint(directory: str | Path, cfg: DeepseekV4Config, state: dict[str, torch.Tensor], *,
                    fp8: bool = False, shards: int = 1) -> Path:
    """Write ``config.json`` and the tensors (release dtypes; FP8 + ``.scale`` for linears when ``fp8``)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    hf = cfg.to_hf_dict()
    if fp8:
        hf["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
                                     "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
    (directory / "config.json").write_text(json.dumps(hf, indent=2))
    tensors: dict[str, torch.Tensor] = {}
    for name, t in state.items():
        if fp8 and _FP8.search(name):
            tensors[name], tensors[name[: -len("weight")] + "scale"] = quantize_fp8_weight(t)
        else:
            tensors[name] = t.to(stored_dtype(name)).contiguous()
    names = sorted(tensors)
    if shards <= 1:
        save_file(tensors, str(directory / "model.safetensors"))
        return directory
    per = math.ceil(len(names) / shards)
    weight_map = {}
    for k in range(shards):
        fname = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[k * per : (k + 1) * per]}
        save_file(part, str(directory / fname))
        weight_map.update({n: fname for n in part})
    (directory / INDEX_FILE).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}, indent=2))
    return directory


def _load_file(path: Path) -> dict[str, torch.Tensor]:
    if not path.is_file():
        raise CheckpointError(f"checkpoint file {path} is missing")
    try:
        return load_file(str(path))
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"checkpoint file {path} is unreadable or corrupted: {e}") from e


def read_tensors(directory: str | Path) -> dict[str, torch.Tensor]:
    """All stored tensors of a checkpoint directory (as stored: e4m3 weights and scales are not yet merged)."""
    directory = Path(directory)
    index = directory / INDEX_FILE
    tensors: dict[str, torch.Tensor] = {}
    if index.is_file():
        weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
        for fname in sorted(set(weight_map.values())):
            tensors.update(_load_file(directory / fname))
        absent = sorted(n for n in weight_map if n not in tensors)
        if absent:
            raise CheckpointError(f"tensors listed in {INDEX_FILE} but absent from their files: {absent}")
        return tensors
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"no *.safetensors files in {directory}")
    for f in files:
        tensors.update(_load_file(f))
    return tensors


def dequantize_state(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Merge every ``<name>.weight`` (e4m3) with its ``<name>.scale`` into one fp32 tensor; drop MTP aliases."""
    out: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        if name in _IGNORED_ALIASES or (name.endswith(".scale") and name[:-5] + "weight" in tensors):
            continue
        scale = tensors.get(name[: -len("weight")] + "scale") if name.endswith(".weight") else None
        if t.dtype == torch.float8_e4m3fn:
            if scale is None:
                raise CheckpointError(f"fp8 tensor {name} has no sibling scale tensor")
            try:
                out[name] = dequantize_fp8_weight(t, scale)
            except ValueError as e:
                raise CheckpointError(f"{name}: {e}") from e
        elif scale is not None:
            raise CheckpointError(f"{name} has a scale but dtype {t.dtype}; only fp8 e4m3 weights are supported "
                                  "(packed FP4 experts are not)")
        else:
            out[name] = t
    return out


def load_state(model: DeepseekV4Model, state: dict[str, torch.Tensor]) -> None:
    """Copy ``state`` into ``model``; raises ``CheckpointError`` listing missing / unknown / mis-shaped tensors."""
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unknown = sorted(set(state) - set(expected))
    if missing or unknown:
        raise CheckpointError(f"checkpoint does not match the model: missing tensors {missing}; "
                              f"unknown tensors {unknown}")
    for name, target in expected.items():
        if tuple(state[name].shape) != tuple(target.shape):
            raise CheckpointError(f"tensor {name} has shape {tuple(state[name].shape)}, "
                                  f"the model expects {tuple(target.shape)}")
        if not torch.is_floating_point(target) and torch.is_floating_point(state[name]):
            raise CheckpointError(f"tensor {name} must be an integer tensor, got {state[name].dtype}")
    with torch.no_grad():
        for name, target in expected.items():
            target.copy_(state[name].to(target.dtype))


def load_checkpoint(directory: str | Path, *, dtype: torch.dtype = torch.float32,
                    device: torch.device | str = "cpu", **overrides: object) -> DeepseekV4Model:
    """Build the model described by ``directory/config.json`` and load its weights (FP8 dequantized).

    ``overrides`` set config fields such as ``quant_sim=True`` or ``batch_invariant=True``.
    """
    directory = Path(directory)
    cfg_path = directory / "config.json"
    if not cfg_path.is_file():
        raise CheckpointError(f"{cfg_path} is missing")
    try:
        hf = json.loads(cfg_path.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{cfg_path} is not valid JSON: {e}") from e
    cfg = DeepseekV4Config.from_hf_dict(hf, **overrides)
    state = dequantize_state(read_tensors(directory))
    model = DeepseekV4Model(cfg, dtype=dtype, device=device)
    load_state(model, state)
    return model.eval()
