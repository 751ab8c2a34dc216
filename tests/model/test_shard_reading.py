"""Loading reads each safetensors file once, in the order of its bytes: the number of opens does not grow with
the tensors per file, weight + scale pairs split over files still pair up, and a corrupt header is refused."""

from __future__ import annotations

import builtins
import json
import struct
from collections import Counter
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from atom.models.deepseek_v4 import loader
from atom.models.deepseek_v4.checkpoint import INDEX_FILE, read_tensors
from atom.models.deepseek_v4.loader import CheckpointError, CheckpointIndex, load_checkpoint
from atom.models.deepseek_v4.make_tiny_checkpoint import main as make_tiny_main


@pytest.fixture
def opens(monkeypatch) -> Counter:
    """Counts every open of a ``*.safetensors`` file, by Python's ``open`` or by ``safe_open``, per file name."""
    counts: Counter = Counter()
    real_open, real_safe_open = builtins.open, loader.safe_open

    def counting_open(file, *args, **kwargs):
        if str(file).endswith(".safetensors"):
            counts[Path(file).name] += 1
        return real_open(file, *args, **kwargs)

    def counting_safe_open(file, *args, **kwargs):
        counts[Path(file).name] += 1
        return real_safe_open(file, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", counting_open)
    monkeypatch.setattr(loader, "safe_open", counting_safe_open)
    return counts


def test_loading_opens_each_shard_once_for_its_header_and_once_for_its_data(tmp_path, opens):
    make_tiny_main([str(tmp_path), "--fp8", "--shards", "3"])
    files = sorted(p.name for p in tmp_path.glob("*.safetensors"))
    assert len(files) == 3 and len(read_tensors(tmp_path)) > 3 * 100
    opens.clear()
    CheckpointIndex(tmp_path)
    assert opens == Counter({f: 1 for f in files})
    opens.clear()
    load_checkpoint(tmp_path)
    assert opens == Counter({f: 2 for f in files})


def test_random_access_reads_in_file_order_open_each_file_once(tmp_path, opens):
    make_tiny_main([str(tmp_path), "--shards", "3"])
    index = CheckpointIndex(tmp_path)
    stored = read_tensors(tmp_path)
    assert min(t.dim() for t in stored.values()) >= 1
    opens.clear()
    for path in index.files:
        for name in index.names_in(path):
            assert torch.equal(index.read(name, rows=slice(0, 1)), stored[name][:1])
    assert opens == Counter({p.name: 1 for p in index.files})


def _write_one_tensor_per_file(directory: Path, source: Path, names: list[str]) -> None:
    """The checkpoint ``source`` with one file per tensor, the files named so that they are read in the order of
    ``names``."""
    directory.mkdir()
    (directory / "config.json").write_text((source / "config.json").read_text())
    tensors = read_tensors(source)
    weight_map = {}
    for k, name in enumerate(names):
        fname = f"model-{k + 1:05d}-of-{len(names):05d}.safetensors"
        save_file({name: tensors[name]}, str(directory / fname))
        weight_map[name] = fname
    (directory / INDEX_FILE).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


@pytest.mark.parametrize("order", ["scale_first", "weight_first"])
def test_a_weight_and_its_scale_in_different_files_dequantize_in_either_order(tmp_path, order):
    make_tiny_main([str(tmp_path / "one"), "--fp8"])
    tensors = read_tensors(tmp_path / "one")
    names = sorted(tensors, reverse=order == "weight_first")
    first, second = ("weight", "scale") if order == "weight_first" else ("scale", "weight")
    assert names.index(f"layers.0.attn.wo_a.{first}") < names.index(f"layers.0.attn.wo_a.{second}")
    _write_one_tensor_per_file(tmp_path / "split", tmp_path / "one", names)
    for keep in (True, False):
        split = load_checkpoint(tmp_path / "split", keep_quantized=keep).state_dict()
        whole = load_checkpoint(tmp_path / "one", keep_quantized=keep).state_dict()
        assert split.keys() == whole.keys()
        assert all(torch.equal(split[n].view(torch.uint8), whole[n].view(torch.uint8)) for n in whole)
    assert split["layers.0.attn.wo_a.weight"].dtype == torch.float32


def _raw_file(path: Path, header: dict, data: bytes) -> None:
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)


@pytest.mark.parametrize(("header", "data", "message"), [
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
      "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}, bytes(8),
     r"tensor b starts at data byte 4 but the previous tensor ends at 8"),
    ({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, bytes(8),
     r"tensor a: data_offsets \[0, 8\] hold 8 bytes but shape \(3,\) of F32 needs 12"),
    ({"a": {"dtype": "F4", "shape": [2], "data_offsets": [0, 1]}}, bytes(1), r"tensor a has dtype F4; supported:"),
    ({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, bytes(4),
     r"the tensors end at byte \d+ but the file has \d+ bytes \(truncated or padded\)"),
    ({"a": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}}, bytes(8),
     r"tensor a: shape \[-2\] and data_offsets must be non-negative integers"),
    ({"a": {"dtype": "F32", "shape": [2]}}, bytes(8),
     r"the header entry of tensor a needs dtype, shape and data_offsets"),
])
def test_a_corrupt_header_is_refused_saying_what_is_wrong(tmp_path, header, data, message):
    _raw_file(tmp_path / "model.safetensors", header, data)
    with pytest.raises(CheckpointError, match="model.safetensors is unreadable or corrupted: " + message):
        CheckpointIndex(tmp_path)


def test_a_header_length_past_the_end_of_the_file_is_refused(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(struct.pack("<Q", 1000) + b"{}")
    with pytest.raises(CheckpointError, match=r"the header length 1000 exceeds the file \(10 bytes\)"):
        CheckpointIndex(tmp_path)


def test_a_file_cut_short_after_its_header_was_read_names_the_tensor_and_the_missing_bytes(tmp_path):
    from atom.models.deepseek_v4.shard_reader import ShardFile, read_header  # here: the module is new

    path = tmp_path / "model.safetensors"
    save_file({"a": torch.arange(4, dtype=torch.float32), "b": torch.ones(8, dtype=torch.float32)}, str(path))
    (name, entry), = [(n, e) for n, e in read_header(path) if n == "b"]
    path.write_bytes(path.read_bytes()[:-12])
    with ShardFile(path) as shard, pytest.raises(
            CheckpointError, match=r"tensor b in .*model.safetensors is unreadable: the file ends 12 bytes before"):
        shard.read(name, entry)
