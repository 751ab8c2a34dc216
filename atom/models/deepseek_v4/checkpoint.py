"""Writing (and reading whole) checkpoints in the released DeepSeek-V4 format (dsv4_checkpoint_format.md).

A checkpoint directory holds ``config.json`` (HF keys) and one or more ``*.safetensors`` files (sharded ones are
listed in ``model.safetensors.index.json``).  Tensor names are the official ones (``embed.weight``,
``layers.3.attn.wq_a.weight``, ``mtp.0.e_proj.weight``; no ``model.`` prefix).  Quantized weights carry a sibling
``<name>.scale`` (e8m0): FP8 linears are e4m3 with one scale per 128x128 block, FP4 routed experts are int8 bytes
of packed e2m1 pairs with one scale per 32 inputs (``expert_dtype: "fp4"`` in ``config.json``).

Loading (streamed, weights kept quantized) lives in :mod:`.loader`; ``load_checkpoint`` and ``CheckpointError``
are re-exported here.  ``read_tensors`` reads every stored tensor at once (tests and tools).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Iterable, Iterator, Mapping

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from .config import DeepseekV4Config
from .loader import INDEX_FILE, CheckpointError, load_checkpoint
from .model import DeepseekV4Model
from .quant import quantize_fp8_weight, quantize_mxfp4_weight

__all__ = ["CheckpointError", "load_checkpoint", "random_tensors", "random_state_dict", "save_checkpoint",
           "write_checkpoint", "read_tensors", "stored_dtype", "release_format", "release_tensors", "hf_config",
           "INDEX_FILE"]

_F32 = re.compile(r"(^|\.)(hc_\w+|attn_sink|ape|bias)$")
_FP8 = re.compile(r"(attn\.(wq_a|wq_b|wkv|wo_a|wo_b)|indexer\.wq_b|experts\.\d+\.w[123]|shared_experts\.w[123]"
                  r"|e_proj|h_proj)\.weight$")
_ROUTED = re.compile(r"\.ffn\.experts\.\d+\.w[123]\.weight$")


def stored_dtype(name: str) -> torch.dtype:
    """The dtype a tensor is stored with (release convention): F32 for mHC / sink / ape / router bias, I64 for
    ``tid2eid``, BF16 for everything else."""
    if name.endswith("tid2eid"):
        return torch.int64
    return torch.float32 if _F32.search(name) else torch.bfloat16


def random_tensors(cfg: DeepseekV4Config, seed: int = 0) -> Iterator[tuple[str, torch.Tensor]]:
    """Seeded random fp32 weights for every model tensor, one at a time in name order; values are
    representable in their stored dtype, so a save/load round trip of unquantized tensors is exact."""
    gen = torch.Generator().manual_seed(seed)
    shapes = {k: tuple(v.shape) for k, v in DeepseekV4Model(cfg, device="meta").state_dict().items()}
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
        yield name, (t if dtype == torch.int64 else t.to(dtype).float())


def random_state_dict(cfg: DeepseekV4Config, seed: int = 0) -> dict[str, torch.Tensor]:
    """``random_tensors`` as one dict (loads into ``DeepseekV4Model(cfg)`` with ``load_state_dict``)."""
    return dict(random_tensors(cfg, seed))


def release_format(name: str, *, fp8: bool = False, fp4_experts: bool = False) -> str:
    """How the release stores tensor ``name``: ``mxfp4`` for routed experts (with ``fp4_experts``), ``fp8`` for the
    other quantized linears (with ``fp8``), else ``dense`` (in :func:`stored_dtype`)."""
    if fp4_experts and _ROUTED.search(name):
        return "mxfp4"
    return "fp8" if fp8 and _FP8.search(name) else "dense"


def release_tensors(name: str, t: torch.Tensor, *, fp8: bool = False,
                    fp4_experts: bool = False) -> list[tuple[str, torch.Tensor]]:
    """Tensor ``name`` encoded as the release stores it (:func:`release_format`): packed FP4 as int8 bytes + e8m0
    scales, FP8 e4m3 + e8m0 block scales, or the stored dtype."""
    scale_name = name[: -len("weight")] + "scale"
    fmt = release_format(name, fp8=fp8, fp4_experts=fp4_experts)
    if fmt == "mxfp4":
        packed, scale = quantize_mxfp4_weight(t)
        return [(name, packed.view(torch.int8)), (scale_name, scale)]
    if fmt == "fp8":
        q, scale = quantize_fp8_weight(t)
        return [(name, q), (scale_name, scale)]
    return [(name, t.to(stored_dtype(name)).contiguous())]


def hf_config(cfg: DeepseekV4Config, *, fp8: bool = False, fp4_experts: bool = False) -> dict:
    """``config.json`` of a checkpoint written with these options (quantization declared as the release does)."""
    hf = cfg.to_hf_dict()
    if fp8 or fp4_experts:
        hf["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "scale_fmt": "ue8m0",
                                     "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
    if fp4_experts:
        hf["expert_dtype"] = "fp4"
    return hf


def save_checkpoint(directory: str | Path, cfg: DeepseekV4Config,
                    state: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]], *, fp8: bool = False,
                    fp4_experts: bool = False, shards: int = 1, shard_bytes: int = 0) -> Path:
    """Write ``config.json`` and the tensors in the release layout (see :func:`release_tensors`).

    ``state`` is a dict or a stream of ``(name, fp32 tensor)``.  ``shard_bytes > 0`` starts a new shard whenever
    the current one would exceed it (tensors are encoded and written as they come); otherwise ``shards`` files
    of about equal tensor counts.  More than one shard writes ``model.safetensors.index.json``.
    """
    items = state.items() if isinstance(state, Mapping) else state
    encoded = (pair for name, t in items for pair in release_tensors(name, t, fp8=fp8, fp4_experts=fp4_experts))
    return write_checkpoint(directory, hf_config(cfg, fp8=fp8, fp4_experts=fp4_experts), encoded, shards=shards,
                            shard_bytes=shard_bytes)


def write_checkpoint(directory: str | Path, hf: dict, tensors: Iterable[tuple[str, torch.Tensor]], *,
                     shards: int = 1, shard_bytes: int = 0) -> Path:
    """Write ``config.json`` = ``hf`` and already-encoded ``tensors`` (see :func:`save_checkpoint` for sharding)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(hf, indent=2))
    if shard_bytes > 0:
        parts = _parts_by_bytes(tensors, shard_bytes)
    else:
        stored = dict(tensors)
        names = sorted(stored)
        per = -(-len(names) // max(shards, 1))
        parts = ({n: stored[n] for n in names[k : k + per]} for k in range(0, len(names), per))
    _write_shards(directory, parts)
    return directory


def _parts_by_bytes(pairs: Iterable[tuple[str, torch.Tensor]], limit: int) -> Iterator[dict[str, torch.Tensor]]:
    part: dict[str, torch.Tensor] = {}
    size = 0
    for name, t in pairs:
        nbytes = t.numel() * t.element_size()
        if part and size + nbytes > limit:
            yield part
            part, size = {}, 0
        part[name] = t
        size += nbytes
    if part:
        yield part


def _write_shards(directory: Path, parts: Iterable[dict[str, torch.Tensor]]) -> None:
    """Write each part to its own file as it comes, then name them ``model-0000k-of-0000n`` (or
    ``model.safetensors`` when there is one) and write the index."""
    written: list[tuple[Path, list[str]]] = []
    for k, part in enumerate(parts):
        tmp = directory / f".part-{k:05d}.safetensors"
        save_file(part, str(tmp))
        written.append((tmp, sorted(part)))
    if len(written) == 1:
        written[0][0].rename(directory / "model.safetensors")
        return
    weight_map = {}
    for k, (tmp, names) in enumerate(written):
        fname = f"model-{k + 1:05d}-of-{len(written):05d}.safetensors"
        tmp.rename(directory / fname)
        weight_map.update({n: fname for n in names})
    (directory / INDEX_FILE).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}, indent=2))


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
