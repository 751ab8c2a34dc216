"""Loading one rank's shard of a checkpoint: each tensor read as the slice the rank holds.

Every tensor is opened with ``safetensors.safe_open`` and read through ``get_slice``, so a rank
reads (and allocates) only its rows or columns of a split tensor and nothing of another rank's
experts. FP8 e4m3 weights are sliced together with their block-128 scales (a split of an FP8
dimension must fall on a multiple of 128) and dequantized slice by slice.

The checks of the unsharded loader hold here too: a tensor the model needs that no file holds, a
tensor no rank uses, or a full shape that differs from the config's raises ``CheckpointError``.
"""

from __future__ import annotations

import json
from contextlib import ExitStack
from pathlib import Path

import torch
from safetensors import safe_open

from atom.models.deepseek_v4.loader import INDEX_FILE, IGNORED_ALIASES, CheckpointError
from atom.models.deepseek_v4.loader import read_config as load_config
from atom.models.deepseek_v4.model import DeepseekV4Model
from atom.models.deepseek_v4.quant import WEIGHT_BLOCK, dequantize_fp8_weight
from atom.comm import Comm
from atom.parallel.shard_plan import DROPPED, ShardPlan, Split
from atom.parallel.sharding import local_shape, shard_model

__all__ = ["load_sharded_checkpoint"]


def load_sharded_checkpoint(directory: str | Path, plan: ShardPlan, comm: Comm, *,
                            dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
                            **overrides: object) -> DeepseekV4Model:
    """This rank's shard of the model in ``directory`` (``overrides`` as for ``load_checkpoint``)."""
    directory = Path(directory)
    cfg = load_config(directory, **overrides)
    model = shard_model(DeepseekV4Model(cfg, dtype=dtype, device="meta"), plan, comm, device)
    files = _tensor_files(directory)
    targets = model.state_dict()
    _check_names(set(targets), files, plan)
    with ExitStack() as stack, torch.no_grad():
        handles = {f: stack.enter_context(safe_open(str(f), framework="pt")) for f in set(files.values())}
        for name, target in targets.items():
            spec = plan.spec(name)
            assert spec != DROPPED, name
            t = _read(handles, files, name, spec, tuple(target.shape))
            if not torch.is_floating_point(target) and torch.is_floating_point(t):
                raise CheckpointError(f"tensor {name} must be an integer tensor, got {t.dtype}")
            target.copy_(t.to(target.dtype))
    return model.eval()


def _tensor_files(directory: Path) -> dict[str, Path]:
    """Tensor name -> the file holding it (from the index, or from every ``*.safetensors`` file)."""
    index = directory / INDEX_FILE
    if index.is_file():
        weight_map: dict[str, str] = json.loads(index.read_text())["weight_map"]
        out = {name: directory / fname for name, fname in weight_map.items()}
        for f in set(out.values()):
            if not f.is_file():
                raise CheckpointError(f"checkpoint file {f} is missing")
        return out
    paths = sorted(directory.glob("*.safetensors"))
    if not paths:
        raise CheckpointError(f"no *.safetensors files in {directory}")
    out = {}
    for f in paths:
        try:
            with safe_open(str(f), framework="pt") as h:
                out.update({name: f for name in h.keys()})
        except (OSError, ValueError, RuntimeError) as e:
            raise CheckpointError(f"checkpoint file {f} is unreadable or corrupted: {e}") from e
    return out


def _check_names(expected: set[str], files: dict[str, Path], plan: ShardPlan) -> None:
    stored = {n for n in files if n not in IGNORED_ALIASES
              and not (n.endswith(".scale") and n[: -len("scale")] + "weight" in files)}
    missing = sorted(expected - stored)
    unknown = sorted(n for n in stored - expected if plan.spec(n) != DROPPED)
    if missing or unknown:
        raise CheckpointError(f"checkpoint does not match the model: missing tensors {missing}; "
                              f"unknown tensors {unknown}")


def _read(handles: dict, files: dict[str, Path], name: str, spec: Split | None,
          want: tuple[int, ...]) -> torch.Tensor:
    """Tensor ``name`` as this rank holds it (FP8 weights dequantized to fp32)."""
    sl = handles[files[name]].get_slice(name)
    full = tuple(sl.get_shape())
    if spec is not None and full[spec.dim] % spec.parts:
        raise CheckpointError(f"tensor {name} has shape {full}: dim {spec.dim} does not split into {spec.parts}")
    if local_shape(full, spec) != want:
        raise CheckpointError(f"tensor {name} has shape {full}, the model expects {want} "
                              f"of it on this rank ({spec})")
    index = _index(full, spec)
    t = sl[index]
    scale_name = name[: -len("weight")] + "scale" if name.endswith(".weight") else None
    if scale_name is None or scale_name not in files:
        if t.dtype == torch.float8_e4m3fn:
            raise CheckpointError(f"fp8 tensor {name} has no sibling scale tensor")
        return t
    if t.dtype != torch.float8_e4m3fn:
        raise CheckpointError(f"{name} has a scale but dtype {t.dtype}; only fp8 e4m3 weights are supported")
    scale = handles[files[scale_name]].get_slice(scale_name)[_scale_index(name, full, spec)]
    try:
        return dequantize_fp8_weight(t, scale)
    except ValueError as e:
        raise CheckpointError(f"{name}: {e}") from e


def _index(full: tuple[int, ...], spec: Split | None) -> tuple[slice, ...]:
    index = [slice(None)] * len(full)
    if spec is not None:
        index[spec.dim] = slice(*spec.bounds(full[spec.dim]))
    return tuple(index)


def _scale_index(name: str, full: tuple[int, ...], spec: Split | None) -> tuple[slice, ...]:
    """The block-scale rows / columns that cover this rank's slice of an FP8 weight."""
    index = [slice(None)] * len(full)
    if spec is not None:
        start, stop = spec.bounds(full[spec.dim])
        if start % WEIGHT_BLOCK or (stop % WEIGHT_BLOCK and stop != full[spec.dim]):
            raise CheckpointError(f"fp8 tensor {name}: the split {start}..{stop} of dim {spec.dim} does not fall "
                                  f"on its {WEIGHT_BLOCK}-wide scale blocks; use a parallel size that does")
        index[spec.dim] = slice(start // WEIGHT_BLOCK, -(-stop // WEIGHT_BLOCK))
    return tuple(index)
