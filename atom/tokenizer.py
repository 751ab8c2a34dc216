"""Text <-> token ids, and chat prompts, for one model.

:class:`Tokenizer` wraps a Hugging Face ``tokenizers`` tokenizer loaded from a model directory
(``tokenizer.json``, plus ``tokenizer_config.json`` for ``bos_token`` / ``eos_token`` /
``chat_template``; a ``chat_template.jinja`` file is also accepted). Chat templates render in a
sandboxed jinja2 environment, so a template shipped with a checkpoint cannot touch the process.

:func:`write_builtin_tokenizer` writes the tokenizer of the built-in tiny model: byte-level (token
id ``b`` is the byte ``b``, for all 256 bytes) plus DeepSeek's special tokens, with a DeepSeek-style
chat template. It is built in code with ``tokenizers`` (no download), so ``atom serve`` works offline.

Contract: bad files raise ``ValueError`` naming the file and what is wrong; bad messages given to
:meth:`Tokenizer.apply_chat_template` raise ``ValueError`` (the server maps it to HTTP 400).
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import Any, Mapping, Sequence

__all__ = ["Tokenizer", "write_builtin_tokenizer", "BUILTIN_SPECIAL_TOKENS", "BUILTIN_CHAT_TEMPLATE"]

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
USER = "<｜User｜>"
ASSISTANT = "<｜Assistant｜>"
PAD = "<｜▁pad▁｜>"
THINK, END_THINK = "<think>", "</think>"

#: Special tokens of the built-in tokenizer, in id order after the 256 byte tokens (ids 256..262).
BUILTIN_SPECIAL_TOKENS = (BOS, EOS, USER, ASSISTANT, PAD, THINK, END_THINK)

#: DeepSeek-style template: BOS, system prompts, then ``<｜User｜>u<｜Assistant｜>a<｜end▁of▁sentence｜>``.
BUILTIN_CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- for m in messages if m['role'] == 'system' %}{{ m['content'] }}{% endfor %}"
    "{%- for m in messages %}"
    "{%- if m['role'] == 'user' %}" + USER + "{{ m['content'] }}"
    "{%- elif m['role'] == 'assistant' %}" + ASSISTANT + "{{ m['content'] }}{{ eos_token }}"
    "{%- elif m['role'] != 'system' %}{{ raise_exception('unsupported role ' ~ m['role']) }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}" + ASSISTANT + "{% endif %}"
)


def _token_text(value: Any) -> str | None:
    """``bos_token`` / ``eos_token`` appear as a string or as ``{"content": ...}`` in HF configs."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        return value["content"]
    raise ValueError(f"special token entry {value!r} is neither a string nor {{'content': str}}")


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path} is not readable JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a JSON object, got {type(data).__name__}")
    return data


def _pick_template(raw: Any, path: Path) -> str | None:
    """HF stores ``chat_template`` as a string or as a list of ``{"name", "template"}``."""
    if raw is None or isinstance(raw, str):
        return raw
    if isinstance(raw, list):
        named = {t.get("name"): t.get("template") for t in raw if isinstance(t, Mapping)}
        if isinstance(named.get("default"), str):
            return named["default"]
    raise ValueError(f"{path}: chat_template must be a string or a list with a 'default' entry")


class Tokenizer:
    """A loaded tokenizer: ``encode`` / ``decode`` and the chat template.

    ``eos_token_id`` / ``bos_token_id`` are None when the config does not name those tokens (or
    names tokens the vocabulary lacks). ``vocab_size`` counts added tokens too.
    """

    def __init__(self, hf_tokenizer: Any, *, bos_token: str | None = None, eos_token: str | None = None,
                 chat_template: str | None = None, name: str = "tokenizer") -> None:
        self._tok = hf_tokenizer
        self.name = name
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.chat_template = chat_template
        self.bos_token_id = None if bos_token is None else hf_tokenizer.token_to_id(bos_token)
        self.eos_token_id = None if eos_token is None else hf_tokenizer.token_to_id(eos_token)
        self._template: Any = None  # compiled lazily
        self._byte_level = type(getattr(hf_tokenizer, "decoder", None)).__name__ == "ByteLevel"
        self._added = {t.content for t in hf_tokenizer.get_added_tokens_decoder().values()}

    # ---- loading ------------------------------------------------------------------------------
    @classmethod
    def from_dir(cls, path: str | Path) -> "Tokenizer":
        """Load ``tokenizer.json`` (required) and ``tokenizer_config.json`` (optional) from ``path``."""
        from tokenizers import Tokenizer as HfTokenizer

        directory = Path(path)
        tok_file = directory / "tokenizer.json"
        if not tok_file.is_file():
            raise ValueError(f"no tokenizer.json in {directory}; a model directory needs a Hugging Face "
                             "tokenizers file named tokenizer.json")
        try:
            hf = HfTokenizer.from_file(str(tok_file))
        except Exception as exc:  # tokenizers raises a bare Exception on bad files
            raise ValueError(f"{tok_file} is not a valid tokenizers file: {exc}") from None
        cfg_file = directory / "tokenizer_config.json"
        cfg = _read_json(cfg_file) if cfg_file.is_file() else {}
        template = _pick_template(cfg.get("chat_template"), cfg_file)
        jinja_file = directory / "chat_template.jinja"
        if template is None and jinja_file.is_file():
            template = jinja_file.read_text(encoding="utf-8")
        try:
            bos, eos = _token_text(cfg.get("bos_token")), _token_text(cfg.get("eos_token"))
        except ValueError as exc:
            raise ValueError(f"{cfg_file}: {exc}") from None
        return cls(hf, bos_token=bos, eos_token=eos, chat_template=template, name=directory.name)

    # ---- text <-> ids -------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return int(self._tok.get_vocab_size(with_added_tokens=True))

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text``; ``add_special_tokens`` applies the tokenizer's post-processor (BOS).

        Raises ``ValueError`` for text that is not valid Unicode (a lone surrogate such as ``\\ud800``).
        """
        if not isinstance(text, str):
            raise ValueError(f"encode needs a str, got {type(text).__name__}")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(f"text is not valid Unicode at position {exc.start}: {exc.reason}") from None
        # the batch entry points run without the interpreter lock (``encode`` holds it throughout), so a
        # long prompt being tokenized on a parse thread does not stall the engine thread's steps
        batch = getattr(self._tok, "encode_batch_fast", self._tok.encode_batch)
        return list(batch([text], add_special_tokens=add_special_tokens)[0].ids)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of ``ids``; ids outside the vocabulary are dropped, broken UTF-8 becomes U+FFFD."""
        return str(self._tok.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens))

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def token_bytes(self, token_id: int) -> bytes:
        """The exact bytes one token stands for (a byte-level token may be part of a character).

        Byte-level vocabularies store each byte as a printable stand-in character (the GPT-2 mapping),
        which is undone here; other tokens (special tokens, other decoders) are their decoded text.
        """
        piece = self._tok.id_to_token(int(token_id))
        if piece is None:
            return b""
        if self._byte_level and all(ch in _UNBYTE for ch in piece) and piece not in self._added:
            return bytes(_UNBYTE[ch] for ch in piece)
        return self.decode([token_id], skip_special_tokens=False).encode("utf-8")

    # ---- chat ---------------------------------------------------------------------------------
    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str:
        """Render ``messages`` (``{"role": str, "content": str}`` each) with the model's template.

        Raises ``ValueError`` when the model has no template, a message is malformed, or the
        template itself rejects the conversation.
        """
        import jinja2

        if self.chat_template is None:
            raise ValueError(f"model {self.name!r} has no chat template; use /v1/completions instead")
        if not isinstance(messages, list) or not messages:
            raise ValueError("messages must be a non-empty list")
        for i, m in enumerate(messages):
            if not isinstance(m, Mapping) or not isinstance(m.get("role"), str):
                raise ValueError(f"messages[{i}] must be an object with a string 'role'")
            if not isinstance(m.get("content", ""), (str, type(None))):
                raise ValueError(f"messages[{i}].content must be a string")
        try:
            return str(self._compiled().render(messages=messages, add_generation_prompt=add_generation_prompt,
                                               bos_token=self.bos_token or "", eos_token=self.eos_token or ""))
        except jinja2.TemplateError as exc:
            raise ValueError(f"chat template failed: {exc}") from None

    def _compiled(self) -> Any:
        if self._template is None:
            import jinja2
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            def raise_exception(message: str) -> None:
                raise jinja2.TemplateError(message)

            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            env.globals["raise_exception"] = raise_exception
            env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
            try:
                self._template = env.from_string(self.chat_template)
            except jinja2.TemplateError as exc:
                raise ValueError(f"chat template of {self.name!r} does not compile: {exc}") from None
        return self._template


def _byte_alphabet() -> list[str]:
    """The printable stand-in character of each byte 0..255, in byte order (the GPT-2 byte mapping
    that ``tokenizers``' ByteLevel pre-tokenizer and decoder use)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    shifted, extra = {}, 0
    for b in range(256):
        if b in keep:
            shifted[b] = chr(b)
        else:
            shifted[b] = chr(256 + extra)
            extra += 1
    return [shifted[b] for b in range(256)]


_UNBYTE = {ch: b for b, ch in enumerate(_byte_alphabet())}


def write_builtin_tokenizer(out_dir: str | Path) -> Path:
    """Write the built-in byte-level tokenizer (``tokenizer.json`` + ``tokenizer_config.json``).

    263 tokens: ids 0..255 are the bytes, 256..262 are :data:`BUILTIN_SPECIAL_TOKENS`. ``encode``
    prepends BOS (DeepSeek behaviour). Deterministic: the same files every time.
    """
    from tokenizers import AddedToken, decoders, models, pre_tokenizers, processors
    from tokenizers import Tokenizer as HfTokenizer

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    alphabet = _byte_alphabet()
    assert set(alphabet) == set(pre_tokenizers.ByteLevel.alphabet()), "byte mapping disagrees with tokenizers"
    tok = HfTokenizer(models.BPE(vocab={ch: b for b, ch in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in BUILTIN_SPECIAL_TOKENS])
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, 256)])
    assert tok.token_to_id(BOS) == 256 and tok.get_vocab_size(with_added_tokens=True) == 263
    tok.save(str(out / "tokenizer.json"))
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS, "eos_token": EOS,
              "pad_token": PAD, "add_bos_token": True, "model_max_length": 65536,
              "chat_template": BUILTIN_CHAT_TEMPLATE}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n",
                                              encoding="utf-8")
    return out
