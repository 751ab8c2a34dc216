"""The tokenizer: the built-in byte-level one, loading from a directory, chat templates, bad files."""

import json

import pytest

from atom.tokenizer import BUILTIN_SPECIAL_TOKENS, Tokenizer, write_builtin_tokenizer


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory):
    return write_builtin_tokenizer(tmp_path_factory.mktemp("tok"))


@pytest.fixture(scope="module")
def tok(tok_dir):
    return Tokenizer.from_dir(tok_dir)


def test_the_builtin_tokenizer_has_256_bytes_and_the_deepseek_specials_well_under_the_tiny_vocab(tok):
    assert tok.vocab_size == 256 + len(BUILTIN_SPECIAL_TOKENS) < 512
    assert tok.bos_token_id == 256 and tok.eos_token_id == 257
    assert tok.token_to_id("<｜User｜>") == 258 and tok.token_to_id("<｜Assistant｜>") == 259


def test_encoding_is_one_token_per_utf8_byte_after_bos_and_decoding_round_trips(tok):
    text = "héllo 世界\n\t ok"
    ids = tok.encode(text)
    assert ids == [256, *text.encode("utf-8")]
    assert tok.decode(ids) == text
    assert tok.encode(text, add_special_tokens=False) == list(text.encode("utf-8"))


def test_decode_drops_ids_outside_the_vocabulary_and_specials_unless_asked(tok):
    assert tok.decode([300, 104, 257, 511, 105]) == "hi"
    assert tok.decode([104, 257], skip_special_tokens=False) == "h<｜end▁of▁sentence｜>"


def test_the_chat_template_renders_deepseek_style_and_tokenizes_specials_as_single_ids(tok):
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "yo"}, {"role": "user", "content": "again"}]
    text = tok.apply_chat_template(msgs)
    assert text == ("<｜begin▁of▁sentence｜>S<｜User｜>hi<｜Assistant｜>yo<｜end▁of▁sentence｜>"
                    "<｜User｜>again<｜Assistant｜>")
    ids = tok.encode(text, add_special_tokens=False)
    assert ids[:3] == [256, ord("S"), 258] and ids[-1] == 259
    assert not tok.apply_chat_template(msgs, add_generation_prompt=False).endswith("<｜Assistant｜>")


@pytest.mark.parametrize("messages,fragment", [
    ([], "non-empty list"),
    ([{"content": "x"}], "string 'role'"),
    ([{"role": "user", "content": 5}], "content must be a string"),
    ([{"role": "tool", "content": "x"}], "unsupported role tool"),
])
def test_bad_chat_messages_raise_value_error_with_a_reason(tok, messages, fragment):
    with pytest.raises(ValueError, match=fragment):
        tok.apply_chat_template(messages)


def test_a_template_cannot_reach_python_internals_because_it_runs_sandboxed(tok_dir, tmp_path):
    (tmp_path / "tokenizer.json").write_text((tok_dir / "tokenizer.json").read_text())
    evil = "{{ messages.__class__.__mro__[1].__subclasses__() }}"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": evil}))
    with pytest.raises(ValueError, match="chat template failed"):
        Tokenizer.from_dir(tmp_path).apply_chat_template([{"role": "user", "content": "x"}])


def test_a_directory_without_tokenizer_json_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="no tokenizer.json"):
        Tokenizer.from_dir(tmp_path)


def test_a_corrupt_tokenizer_json_is_a_clear_error(tmp_path):
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(ValueError, match="not a valid tokenizers file"):
        Tokenizer.from_dir(tmp_path)


def test_a_corrupt_tokenizer_config_is_a_clear_error(tok_dir, tmp_path):
    (tmp_path / "tokenizer.json").write_text((tok_dir / "tokenizer.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text("[1, 2")
    with pytest.raises(ValueError, match="tokenizer_config.json is not readable JSON"):
        Tokenizer.from_dir(tmp_path)


def test_special_tokens_given_as_objects_and_template_lists_are_understood(tok_dir, tmp_path):
    (tmp_path / "tokenizer.json").write_text((tok_dir / "tokenizer.json").read_text())
    cfg = {"bos_token": {"content": "<｜begin▁of▁sentence｜>"}, "eos_token": {"content": "<｜end▁of▁sentence｜>"},
           "chat_template": [{"name": "default", "template": "{{ messages[0]['content'] }}!"}]}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    t = Tokenizer.from_dir(tmp_path)
    assert (t.bos_token_id, t.eos_token_id) == (256, 257)
    assert t.apply_chat_template([{"role": "user", "content": "x"}]) == "x!"


def test_a_model_without_a_chat_template_says_so(tok_dir, tmp_path):
    (tmp_path / "tokenizer.json").write_text((tok_dir / "tokenizer.json").read_text())
    t = Tokenizer.from_dir(tmp_path)
    assert t.eos_token_id is None
    with pytest.raises(ValueError, match="has no chat template"):
        t.apply_chat_template([{"role": "user", "content": "x"}])


def test_the_builtin_tokenizer_files_are_byte_identical_on_every_write(tok_dir, tmp_path):
    again = write_builtin_tokenizer(tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (again / name).read_bytes() == (tok_dir / name).read_bytes()
