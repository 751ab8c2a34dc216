"""One reader of ``config.json``: the checkpoint loader's errors come from ``atom.config.load_hf_config``."""

import json

import pytest

from atom.models.deepseek_v4.config import DeepseekV4Config
from atom.models.deepseek_v4.loader import CheckpointError, read_config


def test_a_missing_or_broken_config_json_is_a_checkpoint_error_naming_the_file(tmp_path):
    with pytest.raises(CheckpointError, match=r"no config\.json at .*config\.json"):
        read_config(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match=r"config\.json is not valid JSON"):
        read_config(tmp_path)
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(CheckpointError, match=r"config\.json must hold a JSON object, not list"):
        read_config(tmp_path)


def test_read_config_applies_overrides_to_the_written_config(tmp_path):
    tiny = DeepseekV4Config.tiny()
    (tmp_path / "config.json").write_text(json.dumps(tiny.to_hf_dict()))
    cfg = read_config(tmp_path, batch_invariant=True)
    assert cfg.n_layers == tiny.n_layers and cfg.batch_invariant is True
