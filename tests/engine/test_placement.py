"""Device, dtype, quantization simulation and model location: what ``atom serve`` resolves before loading."""

import json
import os
import subprocess
import sys

import pytest
import torch

from atom.config import ModelConfig
from atom.model_executor.placement import resolve_device, resolve_dtype, resolve_model_dir, resolve_quant_sim


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU, so auto does not pick the CPU")
def test_auto_runs_on_the_cpu_in_float32_without_a_gpu_and_a_gpu_asked_for_is_an_error():
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_dtype("auto", torch.device("cpu")) == torch.float32
    assert resolve_dtype("auto", torch.device("cuda")) == torch.bfloat16
    assert resolve_dtype("bfloat16", torch.device("cpu")) == torch.bfloat16
    with pytest.raises(ValueError, match="'rocm:1' was asked for but torch sees no CUDA/ROCm GPU"):
        resolve_device("rocm:1")


def test_float64_is_a_cpu_verification_mode_and_is_refused_on_a_gpu():
    assert resolve_dtype("float64", torch.device("cpu")) == torch.float64
    with pytest.raises(ValueError, match="dtype float64 runs on the CPU only .* on cuda:0 use bfloat16 or float32"):
        resolve_dtype("float64", torch.device("cuda:0"))


def test_bad_device_dtype_and_quant_sim_values_name_what_is_accepted():
    with pytest.raises(ValueError, match="device='tpu'; accepted: auto, cpu, cuda"):
        ModelConfig(device="tpu")
    with pytest.raises(ValueError, match="dtype='float16'; accepted: auto, bfloat16, float32, float64"):
        ModelConfig(dtype="float16")
    with pytest.raises(ValueError, match="quant_sim='yes'; accepted: auto, on, off"):
        ModelConfig(quant_sim="yes")


def test_quant_sim_auto_follows_the_quantization_config_of_the_checkpoint(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"quantization_config": {"quant_method": "fp8"}}))
    assert resolve_quant_sim("auto", tmp_path) is True
    assert resolve_quant_sim("off", tmp_path) is False
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 64}))
    assert resolve_quant_sim("auto", tmp_path) is False
    assert resolve_quant_sim("on", tmp_path) is True


def test_a_missing_directory_and_a_file_are_named(tmp_path):
    with pytest.raises(ValueError, match="model directory .*missing does not exist"):
        resolve_model_dir(str(tmp_path / "missing"))
    (tmp_path / "f").write_text("x")
    with pytest.raises(ValueError, match="is not a directory"):
        resolve_model_dir(str(tmp_path / "f"))
    assert resolve_model_dir(str(tmp_path)) == tmp_path


def test_a_repo_id_without_huggingface_hub_says_how_to_get_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # makes the import fail
    with pytest.raises(ValueError, match="install huggingface_hub"):
        resolve_model_dir("deepseek-ai/DeepSeek-V4-Flash")


@pytest.mark.slow  # a fresh interpreter importing torch and huggingface_hub
def test_a_repo_id_that_cannot_be_fetched_offline_is_a_clear_error(tmp_path):
    code = ("from atom.model_executor.placement import resolve_model_dir\n"
            "try:\n    resolve_model_dir('deepseek-ai/DeepSeek-V4-Flash')\n"
            "except ValueError as e:\n    print(e)\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120).stdout
    assert "could not fetch 'deepseek-ai/DeepSeek-V4-Flash' from the Hugging Face Hub" in out
    assert "hf download deepseek-ai/DeepSeek-V4-Flash --local-dir DIR" in out
