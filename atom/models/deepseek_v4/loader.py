"""Streamed loading of a release-format DeepSeek-V4 checkpoint onto a device, weights kept as stored.

``load_checkpoint(directory, dtype=, device=)``:

1. reads ``config.json`` and every safetensors header (``CheckpointIndex``; sharded checkpoints through
   ``model.safetensors.index.json``) without reading any tensor data;
2. builds the model on the ``meta`` device (no memory), its routed experts already in the stored format of the
   first one (``expert_format``: thousands of Linears need no conversion), and gives every other Linear whose
   checkpoint weight has a sibling ``.scale`` its stored format: FP8 e4m3 (``fp8``) or packed e2m1 pairs
   (``mxfp4``; ``int8`` in the release, kept as ``uint8``).  ``attn.wo_a`` is dequantized to ``dtype`` on load,
   as the official conversion does, because attention multiplies it per group; ``keep_quantized=False``
   dequantizes all;
3. checks every name, shape and dtype against the model and the free memory of ``device``, failing before
   any data is read with a ``CheckpointError`` naming each bad tensor and what was expected;
4. reads each file once, its tensors in the order their bytes lie (``ShardFile``: one open and one sequential
   pass per shard whatever its tensor count; plain reads into fresh buffers, no memory map, so peak memory stays
   near the resident model plus twice the largest tensor), converts each straight to ``device`` and its target
   dtype and installs it as the parameter; a progress bar counts shards.

MTP tensors are read only with ``load_mtp=True``; the release's MTP aliases of the embedding and head
(``mtp.0.emb.tok_emb.weight``, ``mtp.0.head.weight``) are skipped.  ``CheckpointIndex.read`` reads one tensor or a
slice of it (``safe_open.get_slice``, the last file's handle kept open), so a tensor-parallel split reads its part
of a tensor only; ``plan_model`` (steps 1 to 3) is shared with the sharded loader of ``atom.parallel``.
"""

from __future__ import annotations

import gc
import json
import re
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import torch
from safetensors import SafetensorError, safe_open
from torch import nn

from atom.config import load_hf_config

from .config import DeepseekV4Config
from .layers import Linear
from .model import DeepseekV4Model, ModelWeights
from .quant import dequantize_fp8_weight, dequantize_mxfp4_weight
from .shard_reader import CheckpointError, ShardFile, TensorEntry, read_header

__all__ = ["CheckpointError", "CheckpointIndex", "load_checkpoint", "plan_model", "read_config", "check_fits",
           "available_bytes", "convert_stored", "dequantize_stored", "INDEX_FILE", "named_tensors",
           "collection_paused"]

INDEX_FILE = "model.safetensors.index.json"
IGNORED_ALIASES = ("mtp.0.emb.tok_emb.weight", "mtp.0.head.weight")
_DEQUANT_ON_LOAD = re.compile(r"attn\.wo_a$")
_FLOATS = ("F64", "F32", "BF16", "F16")
_SCALES = ("F8_E8M0", "U8")
_DEQUANTIZED = ("F8_E4M3", "I8", "U8")  # the stored dtypes of a weight dequantized on load
_STORED_FORMAT = {"F8_E4M3": "fp8", "I8": "mxfp4", "U8": "mxfp4"}


class CheckpointIndex:
    """Every tensor of a checkpoint directory, from the safetensors headers (no tensor data is read).

    ``entries`` maps each name to its ``TensorEntry``; ``names_in(file)`` lists a file's tensors in the order of
    their bytes (each header is parsed once, so no per-tensor work scans the whole checkpoint)."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.entries: dict[str, TensorEntry] = {}
        self._in_file: dict[Path, list[str]] = {}
        self._handle: tuple[Path, str, safe_open] | None = None
        index = self.directory / INDEX_FILE
        if index.is_file():
            listed = self._weight_map(index)
            shard_names = {f: Path(f).name for f in set(listed.values())}  # a few files for tens of thousands of names
            self.files = sorted(self.directory / f for f in shard_names)
        else:
            listed = None
            self.files = sorted(self.directory.glob("*.safetensors"))
            if not self.files:
                raise CheckpointError(f"no *.safetensors files in {self.directory}")
        for path in self.files:
            tensors = read_header(path)
            self._in_file[path] = [name for name, _ in tensors]
            self.entries.update(tensors)
        if listed is not None:
            entries = self.entries
            absent = sorted(n for n, f in listed.items() if n not in entries or entries[n].file.name != shard_names[f])
            if absent:
                raise CheckpointError(f"tensors listed in {INDEX_FILE} but absent from their files: {absent[:20]}")

    @staticmethod
    def _weight_map(index: Path) -> dict[str, str]:
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise CheckpointError(f"{index} is not a safetensors index (a JSON object with 'weight_map'): {e}") from e
        if not isinstance(weight_map, dict) or not all(type(f) is str for f in weight_map.values()):
            raise CheckpointError(f"{index}: 'weight_map' must map each tensor name to a file name (a string)")
        missing = sorted(f for f in set(weight_map.values()) if not (index.parent / f).is_file())
        if missing:
            raise CheckpointError(f"{INDEX_FILE} lists shard files that are missing: {missing}")
        return weight_map

    def __contains__(self, name: str) -> bool:
        return name in self.entries

    def names_in(self, path: Path) -> list[str]:
        """The tensors of file ``path`` in the order their bytes lie (a name another file repeats is kept by the
        later file, as in ``entries``)."""
        return [n for n in self._in_file[path] if self.entries[n].file == path]

    @property
    def nbytes(self) -> int:
        """Bytes of tensor data on disk (headers excluded)."""
        return sum(e.nbytes for e in self.entries.values())

    def read(self, name: str, device: torch.device | str = "cpu",
             rows: slice | tuple[slice, ...] | None = None) -> torch.Tensor:
        """Tensor ``name`` (or its ``rows``, or a slice per dimension) on ``device``.

        Random access through ``safe_open``; the last file's handle stays open, so reading the tensors of one
        file after another opens each file once (whole files are best read with :class:`ShardFile`)."""
        entry = self.entries[name]
        try:
            f = self._open(entry.file, str(device))
            return f.get_tensor(name) if rows is None else f.get_slice(name)[rows]
        except (SafetensorError, OSError, ValueError, RuntimeError) as e:
            raise CheckpointError(f"tensor {name} in {entry.file} is unreadable: {e}") from e

    def _open(self, path: Path, device: str) -> safe_open:
        if self._handle is None or self._handle[:2] != (path, device):
            self._handle = None  # unmap the previous file first
            self._handle = (path, device, safe_open(str(path), framework="pt", device=device))
        return self._handle[2]

    def close(self) -> None:
        """Drop the file handle ``read`` keeps (its mapping goes with it)."""
        self._handle = None


def read_config(directory: str | Path, **overrides: object) -> DeepseekV4Config:
    """``DeepseekV4Config`` of ``directory/config.json`` with field ``overrides`` (``quant_sim=True``, ...).

    The file is read by :func:`atom.config.load_hf_config`, the one reader of a ``config.json``; a
    missing or broken one is a :class:`CheckpointError` with its message."""
    try:
        hf = load_hf_config(Path(directory) / "config.json")
    except ValueError as e:
        raise CheckpointError(str(e)) from None
    return DeepseekV4Config.from_hf_dict(hf, **overrides)


def available_bytes(device: torch.device | str) -> int | None:
    """Free memory of ``device`` (``MemAvailable`` for the CPU); None when it cannot be known."""
    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    if device.type == "cpu":
        try:
            for line in Path("/proc/meminfo").read_text().splitlines():
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            return None
    return None


def check_fits(needed: int, device: torch.device | str, available: int | None = None) -> None:
    """Raise ``CheckpointError`` saying how much memory the weights need when ``device`` has less free."""
    free = available_bytes(device) if available is None else available
    if free is not None and needed > free:
        gib = 2**30
        raise CheckpointError(
            f"the model's weights need {needed / gib:.1f} GiB on {device} but only {free / gib:.1f} GiB is free; "
            "loading would swap or fail. Serve it on a GPU (or several) with enough memory (--device cuda), or "
            "pick a smaller checkpoint")


def _expert_format(index: CheckpointIndex, keep_quantized: bool) -> str:
    """The format the first routed expert's ``w1`` keeps (``dense`` when it is dequantized, has no scale or is
    absent): what the model builds every routed expert's Linears in, so that a checkpoint whose experts share
    one format (every release) needs no per-Linear conversion; :func:`_plan_formats` corrects any other."""
    path = "layers.0.ffn.experts.0.w1"
    entry = index.entries.get(f"{path}.weight")
    if not keep_quantized or entry is None or f"{path}.scale" not in index:
        return "dense"
    return _STORED_FORMAT.get(entry.dtype, "dense")


def _plan_formats(modules: dict[str, nn.Module], index: CheckpointIndex, keep_quantized: bool,
                  act_quant: bool) -> set[str]:
    """Give each Linear of ``modules`` (a model's ``named_modules()``) its stored format in place; return the
    weight names to dequantize while loading.

    A Linear whose checkpoint weight has a sibling ``.scale`` keeps the weight's format (``fp8`` / ``mxfp4``)
    unless it is dequantized on load; every other Linear is dense. One already built in its format (the routed
    experts, built in :func:`_expert_format`'s) is left as it is, so on a release checkpoint only the few
    attention and shared-expert Linears are converted."""
    entries = index.entries
    dequant: set[str] = set()
    for path, mod in modules.items():
        if not isinstance(mod, Linear):
            continue
        weight = entries.get(f"{path}.weight")
        fmt = "dense"
        if weight is not None and f"{path}.scale" in entries:
            fmt = _STORED_FORMAT.get(weight.dtype, "")
            if not fmt:
                raise CheckpointError(f"{path}.weight has a scale but dtype {weight.dtype}; a quantized weight must "
                                      "be F8_E4M3 (fp8) or I8/U8 (packed FP4 pairs)")
            if not keep_quantized or _DEQUANT_ON_LOAD.search(path):
                dequant.add(f"{path}.weight")
                fmt = "dense"
        if mod.fmt != fmt:
            mod.set_format(fmt, act_quant=act_quant)
    return dequant


def named_tensors(model: nn.Module, modules: dict[str, nn.Module] | None = None) -> dict[str, torch.Tensor]:
    """``model.state_dict(keep_vars=True)`` without its per-module hook machinery (a third of the cost on a
    model of 23,000 modules): every parameter and persistent buffer that is not None, under its dotted name.
    The model's modules define no state-dict hooks or extra state, for which the two would differ.
    ``modules``: the model's ``dict(named_modules())`` when the caller has it (a walk over them saved)."""
    out: dict[str, torch.Tensor] = {}
    for path, mod in (modules if modules is not None else dict(model.named_modules())).items():
        prefix = f"{path}." if path else ""
        for name, p in mod._parameters.items():
            if p is not None:
                out[prefix + name] = p
        for name, b in mod._buffers.items():
            if b is not None and name not in mod._non_persistent_buffers_set:
                out[prefix + name] = b
    return out


def _problems(expected: dict[str, torch.Tensor], index: CheckpointIndex, dequant: set[str],
              skipped: set[str]) -> list[str]:
    """Every mismatch between the checkpoint headers and the (meta) model, as readable lines."""
    entries = index.entries
    scales = {n[: -len("weight")] + "scale" for n in dequant}
    out = [f"missing tensor {n} (expected shape {tuple(t.shape)})" for n, t in expected.items() if n not in entries]
    out += [f"unknown tensor {n} (the model has no such parameter)"
            for n in sorted(n for n in entries if n not in expected and n not in scales and n not in skipped)]
    by_dtype: dict[torch.dtype, tuple[str, ...]] = {}  # the stored dtypes a model dtype accepts, found once each
    for name, target in expected.items():
        entry = entries.get(name)
        if entry is None:
            continue
        shape = target.shape
        if name in dequant:
            want = _DEQUANTIZED
            if entry.dtype in ("I8", "U8"):
                shape = (shape[0], shape[1] // 2)
        else:
            want = by_dtype.get(target.dtype) or by_dtype.setdefault(target.dtype, _expected_dtypes(target.dtype))
        if entry.dtype not in want:
            if entry.dtype in _STORED_FORMAT and name.endswith(".weight"):
                out.append(f"quantized tensor {name} ({entry.dtype}) has no sibling scale tensor "
                           f"{name[: -len('weight')]}scale")
            else:
                out.append(f"tensor {name} is stored as {entry.dtype}; expected one of {', '.join(want)}")
        if entry.shape != shape:
            out.append(f"tensor {name} has shape {entry.shape}; the model expects {tuple(shape)}")
    return out


def _expected_dtypes(dtype: torch.dtype) -> tuple[str, ...]:
    """The stored dtypes a model tensor of ``dtype`` is read from (a quantized weight: its own format only)."""
    if dtype == torch.float8_e4m3fn:
        return ("F8_E4M3",)
    if dtype == torch.uint8:
        return ("I8", "U8")
    if dtype == torch.float8_e8m0fnu:
        return _SCALES
    if not dtype.is_floating_point:
        return ("I64", "I32")
    return _FLOATS


def convert_stored(t: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``t`` as the dtype of ``target`` (bit views for packed FP4 and e8m0), never sharing the file mapping."""
    out = _as_target(t, target)
    return out.clone() if out.data_ptr() == t.data_ptr() and out.device.type == "cpu" else out


def _as_target(t: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``t`` as the dtype of ``target``, sharing ``t``'s memory where the dtype allows (for owned buffers)."""
    if t.dtype == target.dtype:  # most tensors: no conversion call at all
        return t
    if target.dtype in (torch.uint8, torch.float8_e8m0fnu) and t.dtype in (torch.int8, torch.uint8):
        return t.view(target.dtype)
    return t.to(target.dtype)


def _install(modules: dict[str, nn.Module], name: str, value: torch.Tensor) -> None:
    """Make ``value`` the parameter or buffer ``name`` (``modules``: the model's ``named_modules()``)."""
    owner, _, attr = name.rpartition(".")
    mod = modules[owner]
    if attr in mod._parameters:  # nn.Parameter(value, requires_grad=False) of a plain tensor, minus its checks
        mod._parameters[attr] = torch.Tensor._make_subclass(nn.Parameter, value, False)
    else:
        mod._buffers[attr] = value


@contextmanager
def collection_paused() -> Iterator[None]:
    """Python's cyclic garbage collector off for the block (back to its previous state after).

    Building and loading a model makes tens of thousands of long-lived objects (modules, parameters, header
    entries) and nothing to collect; left on, the collector runs again and again over the growing heap and cost
    two thirds of building a 35,000-tensor model on ``meta``. Turned back on as it is, its next pass over the
    young objects would walk all of them (about 0.1 s after a 35,000-tensor load) to find nothing, so they are
    first moved to the oldest generation unexamined (``gc.freeze`` then ``gc.unfreeze``), where a full
    collection still examines them; skipped when something else keeps objects frozen (a pre-fork server)."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            if gc.get_freeze_count() == 0:
                gc.freeze()
                gc.unfreeze()
            gc.enable()


def _shards(index: CheckpointIndex, progress: bool) -> Iterator[Path]:
    if not progress:
        yield from index.files
        return
    from tqdm import tqdm

    yield from tqdm(index.files, desc="loading shards", unit="shard")


def plan_model(directory: str | Path, *, dtype: torch.dtype = torch.float32, keep_quantized: bool = True,
               load_mtp: bool = True, model_class: type[ModelWeights] = DeepseekV4Model,
               **overrides: object) -> tuple[ModelWeights, CheckpointIndex, set[str]]:
    """The model of ``directory`` on the ``meta`` device with each Linear in its stored format, the checkpoint's
    index and the weight names to dequantize while loading; every name, shape and dtype already checked.
    ``model_class``: the reference model (default) or the serving model (:mod:`atom.models.deepseek_v4_serving`):
    both declare the same parameters.

    Raises ``CheckpointError`` naming each tensor that does not match (no tensor data is read)."""
    model, index, dequant, _, _ = _plan(directory, dtype, keep_quantized, load_mtp, model_class, overrides)
    return model, index, dequant


def _plan(directory: str | Path, dtype: torch.dtype, keep_quantized: bool, load_mtp: bool,
          model_class: type[ModelWeights], overrides: dict[str, object]
          ) -> tuple[ModelWeights, CheckpointIndex, set[str], dict[str, nn.Module], dict[str, torch.Tensor]]:
    """:func:`plan_model`, also returning the model's ``named_modules()`` and :func:`named_tensors` (one walk
    over the tens of thousands of modules serves the checks, the reads and the switch to evaluation mode)."""
    directory = Path(directory)
    cfg = read_config(directory, **overrides)
    with collection_paused():
        index = CheckpointIndex(directory)
        model = model_class(cfg, dtype=dtype, device="meta", expert_format=_expert_format(index, keep_quantized))
        if not load_mtp:
            model.mtp = nn.ModuleList()
        modules = dict(model.named_modules())
        dequant = _plan_formats(modules, index, keep_quantized, cfg.quant_sim)
        skipped = set(IGNORED_ALIASES) | (set() if load_mtp else {n for n in index.entries if n.startswith("mtp.")})
        expected = named_tensors(model, modules)
        problems = _problems(expected, index, dequant, skipped)
    if problems:
        more = f" (and {len(problems) - 20} more)" if len(problems) > 20 else ""
        raise CheckpointError(f"checkpoint {directory} does not match the model: " + "; ".join(problems[:20]) + more)
    return model, index, dequant, modules, expected


def load_checkpoint(directory: str | Path, *, dtype: torch.dtype = torch.float32,
                    device: torch.device | str = "cpu", keep_quantized: bool = True, load_mtp: bool = True,
                    progress: bool = False, model_class: type[ModelWeights] = DeepseekV4Model,
                    **overrides: object) -> ModelWeights:
    """The model of ``directory`` on ``device`` in evaluation mode: dense weights in ``dtype`` (the router's and the
    compressors', which compute in fp32, in fp32: ``ModelWeights.cast_fp32_weights``), quantized ones as stored;
    ``model_class`` as for :func:`plan_model` (default: the reference model).

    ``overrides`` set config fields (``quant_sim=True`` also FP8-quantizes the inputs of quantized GEMMs).
    Raises ``CheckpointError`` before reading any data when names, shapes, dtypes or free memory are wrong.
    """
    with collection_paused():  # one pause for both steps (resuming costs a collection over the new objects)
        model, index, dequant, modules, expected = _plan(directory, dtype, keep_quantized, load_mtp, model_class,
                                                         overrides)
        _read_into(modules, expected, index, dequant, device, progress)
        _evaluation_mode(modules)
        model.cast_fp32_weights()  # the fp32 GEMMs' weights (router, compressor): cast once, not per call
    return model


def _evaluation_mode(modules: dict[str, nn.Module]) -> None:
    """``model.eval()`` over the model's listed ``modules`` without its recursive walk: each module's
    ``training`` flag cleared directly; a module that overrides ``train`` (none of this model's does) gets
    ``train(False)``."""
    for mod in modules.values():
        if type(mod).train is nn.Module.train:
            mod.__dict__["training"] = False
        else:
            mod.train(False)


def _read_into(modules: dict[str, nn.Module], expected: dict[str, torch.Tensor], index: CheckpointIndex,
               dequant: set[str], device: torch.device | str, progress: bool) -> None:
    """Step 4 of :func:`load_checkpoint`: every tensor of ``index`` read into the planned model whose
    ``named_modules()`` are ``modules`` and whose (meta) tensors are ``expected``."""
    check_fits(sum(t.numel() * t.element_size() for t in expected.values()), device)
    scales = {name[: -len("weight")] + "scale": name for name in dequant}
    waiting: dict[str, torch.Tensor] = {}  # one half of a weight + scale pair whose other half is in a later file
    for path in _shards(index, progress):
        with ShardFile(path, device) as shard:
            for name in index.names_in(path):
                weight = scales.get(name, name)
                if weight in dequant:
                    value = _dequantized(index, shard, name, weight, waiting)
                    if value is not None:
                        _install(modules, weight, value.to(expected[weight].dtype))
                elif name in expected:
                    _install(modules, name, _as_target(shard.read(name, index.entries[name]), expected[name]))
    if waiting:  # plan_model admits a dequantized weight only with its scale, so this is never reached
        raise CheckpointError(f"tensors never paired with their weight or scale: {sorted(waiting)}")


def _dequantized(index: CheckpointIndex, shard: ShardFile, name: str, weight: str,
                 waiting: dict[str, torch.Tensor]) -> torch.Tensor | None:
    """The dequantized ``weight`` once both it and its scale are read, else None.

    ``name`` (the weight or its scale) is in ``shard``; a partner in the same file is read now through the same
    open file, one in another file is paired when that file's turn comes (``waiting`` holds the early half)."""
    scale = weight[: -len("weight")] + "scale"
    partner = scale if name == weight else weight
    if index.entries[partner].file == shard.path:
        if name == scale:
            return None  # read with its weight
        waiting[partner] = shard.read(partner, index.entries[partner])
    waiting[name] = shard.read(name, index.entries[name])
    if partner not in waiting:
        return None
    return dequantize_stored(weight, waiting.pop(weight), waiting.pop(scale))


def dequantize_stored(name: str, weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """fp32 values of quantized weight ``name`` (or a block-aligned part of it) as read from the file:
    FP8 e4m3 with 128x128 block scales, or packed FP4 pairs (int8 / uint8) with one scale per 32 inputs."""
    if scale.dtype == torch.uint8:
        scale = scale.view(torch.float8_e8m0fnu)
    try:
        if weight.dtype == torch.float8_e4m3fn:
            return dequantize_fp8_weight(weight, scale)
        return dequantize_mxfp4_weight(weight.view(torch.uint8), scale)
    except ValueError as e:
        raise CheckpointError(f"{name}: {e}") from e
