"""Where and how the model runs: the model's directory, device, dtype, quantization simulation and KV row format.

Turns the strings of an :class:`~atom.config.EngineConfig` into torch objects, checking them against the
machine: a GPU asked for but not visible, a repo id without ``huggingface_hub`` or without network, are errors
that say what to do instead.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from atom.config import load_hf_config

__all__ = ["resolve_device", "resolve_dtype", "resolve_quant_sim", "resolve_model_dir", "resolve_row_format"]

_ROW_FORMAT_OF_DTYPE = {"fp8": "fp8_ds_mla", "bf16": "bf16", "fp32": "fp32"}


def resolve_row_format(kv_cache_dtype: str, *, on_gpu: bool, quantized: bool) -> str:
    """The arena row format for ``--kv-cache-dtype``: ``auto`` stores fp8 rows on a GPU when the checkpoint
    is quantized (the release reads its KV back from FP8) and fp32 rows otherwise (the CPU reference)."""
    if kv_cache_dtype == "auto":
        kv_cache_dtype = "fp8" if on_gpu and quantized else "fp32"
    if kv_cache_dtype not in _ROW_FORMAT_OF_DTYPE:
        raise ValueError(f"kv_cache_dtype={kv_cache_dtype!r}; accepted: auto, {', '.join(_ROW_FORMAT_OF_DTYPE)}")
    return _ROW_FORMAT_OF_DTYPE[kv_cache_dtype]


_REPO_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
_DOWNLOAD_PATTERNS = ["*.json", "*.safetensors", "tokenizer*"]


def resolve_device(name: str) -> torch.device:
    """``auto`` -> the first CUDA/ROCm GPU when one is visible, else the CPU; ``rocm`` is torch's ``cuda``."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cpu":
        return torch.device("cpu")
    device = torch.device(name.replace("rocm", "cuda"))
    if not torch.cuda.is_available():
        raise ValueError(f"device {name!r} was asked for but torch sees no CUDA/ROCm GPU "
                         f"(torch {torch.__version__}); use --device cpu or auto")
    if device.index is not None and device.index >= torch.cuda.device_count():
        raise ValueError(f"device {name!r}: only {torch.cuda.device_count()} GPU(s) are visible")
    return device


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """``auto`` -> bfloat16 on a GPU, float32 on the CPU (the bit-exact reference path). ``float64`` is a
    CPU verification mode: the GPU kernels do not take it, so it is refused on a GPU."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if name == "float64" and device.type != "cpu":
        raise ValueError(f"dtype float64 runs on the CPU only (a verification mode); on {device} use bfloat16 or "
                         "float32")
    return {"bfloat16": torch.bfloat16, "float32": torch.float32, "float64": torch.float64}[name]


def resolve_quant_sim(setting: str, model_dir: Path) -> bool:
    """``auto`` -> on exactly when ``config.json`` declares a ``quantization_config`` (a quantized release)."""
    if setting != "auto":
        return setting == "on"
    try:
        hf = load_hf_config(model_dir)
    except (OSError, ValueError):
        return False  # the loader reports a missing or broken config.json with its own message
    return bool(hf.get("quantization_config"))


def resolve_model_dir(model: str) -> Path:
    """A local checkpoint directory, or a Hugging Face repo id (``org/name``) fetched with ``huggingface_hub``."""
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    if path.exists() or not _REPO_ID.fullmatch(model):
        what = "is not a directory" if path.exists() else "does not exist"
        raise ValueError(f"model directory {model} {what}; give a checkpoint directory (config.json, "
                         "*.safetensors, tokenizer.json) or a Hugging Face repo id like deepseek-ai/DeepSeek-V4-Flash")
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise ValueError(f"model {model!r} is not a local directory; to fetch it as a Hugging Face repo id "
                         "install huggingface_hub (pip install huggingface_hub), or pass a downloaded "
                         "directory") from None
    try:
        return Path(snapshot_download(repo_id=model, allow_patterns=_DOWNLOAD_PATTERNS))
    except Exception as exc:  # network, auth and missing-repo errors of huggingface_hub have no common base
        raise ValueError(f"could not fetch {model!r} from the Hugging Face Hub ({type(exc).__name__}: {exc}); "
                         "offline or not reachable? download it where there is network (`hf download "
                         f"{model} --local-dir DIR`) and pass DIR") from None
