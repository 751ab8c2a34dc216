"""Loading one rank's shard of a checkpoint: each tensor read as the slice the rank holds, still quantized.

The unsharded loader's planning (:func:`plan_model`) runs first on the ``meta`` device: every name,
full shape and dtype is checked against the config exactly as for one rank, and each Linear gets its
stored format. :func:`shard_model` then gives the rank its local shapes (refusing a quantized split
that would cut scale blocks) and allocates only them, and every tensor is read through
``safe_open(...).get_slice``: a rank reads nothing of another rank's rows, columns or experts.

* FP8 e4m3 weights: the slice of e4m3 values and the 128x128 block scales that cover it (a slice of
  whole blocks, or a slice inside one block, which then holds that block's scale).
* MXFP4 routed experts: rows of packed nibbles and their scales, or (a split of the inputs) bytes
  ``start/2 ..`` and scale groups ``start/32 ..``.
* ``attn.wo_a`` (FP8 in the release, dense in the model as on one rank) is dequantized slice by slice.
"""

from __future__ import annotations

from pathlib import Path

import torch

from atom.comm import Comm
from atom.kernels.quant_formats import FP4_GROUP
from atom.models.deepseek_v4.layers import Linear
from atom.models.deepseek_v4.loader import (CheckpointError, CheckpointIndex, check_fits, convert_stored,
                                            dequantize_stored, plan_model)
from atom.models.deepseek_v4.model import DeepseekV4Model, ModelWeights
from atom.models.deepseek_v4.quant import WEIGHT_BLOCK
from atom.parallel.shard_plan import DROPPED, ShardPlan, Split
from atom.parallel.sharding import shard_model

__all__ = ["load_sharded_checkpoint", "check_shardable"]


def load_sharded_checkpoint(directory: str | Path, plan: ShardPlan, comm: Comm, *,
                            dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu",
                            model_class: type[ModelWeights] = DeepseekV4Model, expert_comm: Comm | None = None,
                            **overrides: object) -> ModelWeights:
    """This rank's shard of the model in ``directory`` (``model_class``: the reference model by default, or
    the serving model), quantized weights kept as stored (``overrides`` as for ``load_checkpoint``);
    ``CheckpointError`` for a checkpoint that does not match or cannot be split. ``comm`` / ``expert_comm``
    as for :func:`shard_model` (``expert_comm`` only with data-parallel attention)."""
    model, index, dequant = plan_model(directory, dtype=dtype, model_class=model_class, **overrides)
    full_shapes = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    logical = {f"{path}.weight": (m.out_features, m.in_features) for path, m in model.named_modules()
               if isinstance(m, Linear)}  # [out, in] (an MXFP4 weight is stored [out, in/2])
    model = _shard(directory, model, plan, comm, device, expert_comm)
    targets = model.state_dict()
    check_fits(sum(t.numel() * t.element_size() for t in targets.values()), device)
    with torch.no_grad():
        for name, target in targets.items():
            spec = plan.spec(name)
            assert spec != DROPPED, name
            owner, _, attr = name.rpartition(".")
            mod = model.get_submodule(owner) if owner else model
            quantized = isinstance(mod, Linear) and mod.fmt != "dense"
            if quantized and attr == "scale":
                continue  # read with its weight
            if quantized:
                weight, scale = _read_quantized(index, owner, mod.fmt, logical[name], spec, device)
                _put(target, weight, name)
                _put(mod.scale, scale, f"{owner}.scale")
            elif name in dequant:
                weight, scale = _read_quantized(index, owner, _stored_format(index, name), full_shapes[name],
                                                spec, device)
                _put(target, dequantize_stored(name, weight, scale), name)
            else:
                _put(target, index.read(name, device, _index(full_shapes[name], spec)), name)
    return model.eval()


def check_shardable(directory: str | Path, plan: ShardPlan, **overrides: object) -> None:
    """``CheckpointError`` (before any rank starts) unless the checkpoint matches its config and every tensor
    can be split by ``plan`` in its stored format (``overrides`` as the ranks load it: ``quant_sim``); only
    headers are read, nothing is allocated."""
    from atom.models.deepseek_v4_serving import DeepseekV4ForServing

    model, _, _ = plan_model(directory, load_mtp=False, model_class=DeepseekV4ForServing, **overrides)
    unused = "not used: nothing runs"
    _shard(directory, model, plan, Comm(plan.dense_rank, plan.dense_size, group=unused), "meta",
           Comm(plan.rank, plan.size, group=unused))


def _shard(directory: str | Path, model: ModelWeights, plan: ShardPlan, comm: Comm,
           device: torch.device | str, expert_comm: Comm | None = None) -> ModelWeights:
    try:
        return shard_model(model, plan, comm, device, expert_comm)
    except ValueError as e:
        raise CheckpointError(f"checkpoint {directory} cannot be split over {plan.size} ranks: {e}") from e


def _put(target: torch.Tensor, value: torch.Tensor, name: str) -> None:
    assert tuple(value.shape) == tuple(target.shape), (name, tuple(value.shape), tuple(target.shape))
    target.copy_(convert_stored(value, target))


def _stored_format(index: CheckpointIndex, name: str) -> str:
    return "fp8" if index.entries[name].dtype == "F8_E4M3" else "mxfp4"


def _index(full: tuple[int, ...], spec: Split | None) -> tuple[slice, ...]:
    index = [slice(None)] * len(full)
    if spec is not None:
        index[spec.dim] = slice(*spec.bounds(full[spec.dim]))
    return tuple(index)


def _read_quantized(index: CheckpointIndex, path: str, fmt: str, full: tuple[int, ...], spec: Split | None,
                    device: torch.device | str) -> tuple[torch.Tensor, torch.Tensor]:
    """``(stored weight slice, its scales)`` of the quantized Linear at ``path`` (logical shape ``full``)."""
    w_index, s_index = [slice(None)] * 2, [slice(None)] * 2
    if spec is not None:
        start, stop = spec.bounds(full[spec.dim])
        if fmt == "fp8":  # whole blocks, or inside one block (check_quantized_split)
            assert start % WEIGHT_BLOCK == 0 or start // WEIGHT_BLOCK == (stop - 1) // WEIGHT_BLOCK, (path, start)
            w_index[spec.dim] = slice(start, stop)
            s_index[spec.dim] = slice(start // WEIGHT_BLOCK, -(-stop // WEIGHT_BLOCK))
        elif spec.dim == 0:
            w_index[0] = s_index[0] = slice(start, stop)
        else:
            assert start % FP4_GROUP == 0 and stop % FP4_GROUP == 0, (path, start, stop)
            w_index[1] = slice(start // 2, stop // 2)
            s_index[1] = slice(start // FP4_GROUP, stop // FP4_GROUP)
    return (index.read(f"{path}.weight", device, tuple(w_index)),
            index.read(f"{path}.scale", device, tuple(s_index)))
