"""Request parameters of the OpenAI API and of vLLM's extras that this server knows but does not implement.

Every such parameter is *declared* on the request models (these classes are mixed into them), so a
request that asks for one is a 400 naming it instead of a 200 that silently ignores it. Each class
lists, in ``refused_values``, the values of its fields that mean "not asked for" (the API's default,
or a value whose meaning this server already has, like ``store: false``); any other value is
refused. A few declared fields are accepted and have no effect on the output by the API's own
definition (an end-user id for abuse monitoring, a cache-routing hint): those are simply not in
``refused_values``. Fields no API defines stay ignored, as OpenAI ignores them (forward
compatibility).

``docs/serving.md`` ("Request parameters") lists every declared field with its status; a test checks
that table against the models.
"""

from __future__ import annotations

import json
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict

__all__ = ["Refusable", "VllmSamplingExtras", "CompletionExtras", "ChatExtras", "StreamOptionExtras", "refusal_message"]

_ABSENT = (None,)


class Refusable(BaseModel):
    """A request model part whose ``refused_values`` (merged over the class hierarchy) name the accepted
    values of each refused field."""

    model_config = ConfigDict(strict=True, extra="ignore")
    refused_values: ClassVar[dict[str, tuple[Any, ...]]] = {}

    @classmethod
    def refusals(cls) -> dict[str, tuple[Any, ...]]:
        """Every refused field of this model with the values it accepts (subclasses win)."""
        table: dict[str, tuple[Any, ...]] = {}
        for klass in reversed(cls.__mro__):
            table.update(vars(klass).get("refused_values", {}))
        return table

    def refused_parameter(self) -> tuple[str, tuple[Any, ...]] | None:
        """``(name, accepted values)`` of the first refused field set to another value, looking into
        nested refusable parts (named ``outer.inner``); None when nothing refused is asked for."""
        for name, accepted in self.refusals().items():
            value = getattr(self, name)
            if not any(value == ok and isinstance(value, bool) == isinstance(ok, bool) for ok in accepted):
                return name, accepted
        for name in type(self).model_fields:
            part = getattr(self, name)
            if isinstance(part, Refusable):
                found = part.refused_parameter()
                if found is not None:
                    return f"{name}.{found[0]}", found[1]
        return None


class StreamOptionExtras(Refusable):
    """``stream_options`` keys the server does not implement."""

    include_obfuscation: Any = None  # OpenAI: pad stream chunks against length side channels
    continuous_usage_stats: Any = None  # vLLM: usage in every chunk

    refused_values: ClassVar[dict[str, tuple[Any, ...]]] = {
        "include_obfuscation": (None, False), "continuous_usage_stats": (None, False)}


class VllmSamplingExtras(Refusable):
    """vLLM's extra parameters of both endpoints that this server does not implement."""

    use_beam_search: Any = None
    length_penalty: Any = None
    truncate_prompt_tokens: Any = None
    prompt_logprobs: Any = None
    allowed_token_ids: Any = None
    bad_words: Any = None
    spaces_between_special_tokens: Any = None
    guided_json: Any = None
    guided_regex: Any = None
    guided_choice: Any = None
    guided_grammar: Any = None
    guided_decoding_backend: Any = None
    guided_whitespace_pattern: Any = None
    structured_outputs: Any = None
    logits_processors: Any = None
    priority: Any = None
    request_id: Any = None
    return_tokens_as_token_ids: Any = None
    return_token_ids: Any = None
    cache_salt: Any = None
    kv_transfer_params: Any = None
    vllm_xargs: Any = None

    refused_values: ClassVar[dict[str, tuple[Any, ...]]] = {
        "use_beam_search": (None, False), "length_penalty": (None, 1.0), "truncate_prompt_tokens": _ABSENT,
        "prompt_logprobs": _ABSENT, "allowed_token_ids": _ABSENT, "bad_words": (None, []),
        # special tokens are joined as the tokenizer's decoder joins them: no spaces are added
        "spaces_between_special_tokens": (None, False),
        "guided_json": _ABSENT, "guided_regex": _ABSENT, "guided_choice": _ABSENT, "guided_grammar": _ABSENT,
        "guided_decoding_backend": _ABSENT, "guided_whitespace_pattern": _ABSENT, "structured_outputs": _ABSENT,
        "logits_processors": _ABSENT, "priority": (None, 0), "request_id": _ABSENT,
        "return_tokens_as_token_ids": (None, False), "return_token_ids": (None, False), "cache_salt": _ABSENT,
        "kv_transfer_params": _ABSENT, "vllm_xargs": _ABSENT}


class CompletionExtras(Refusable):
    """Known ``/v1/completions`` parameters the server does not implement."""

    prompt_embeds: Any = None  # vLLM: embeddings instead of a prompt
    add_special_tokens: Any = None  # vLLM: the tokenizer's BOS before a text prompt (always added here)

    refused_values: ClassVar[dict[str, tuple[Any, ...]]] = {
        "prompt_embeds": _ABSENT, "add_special_tokens": (None, True)}


class ChatExtras(Refusable):
    """Known ``/v1/chat/completions`` parameters (OpenAI's and vLLM's) the server does not implement, and
    the two it accepts that have no effect on the output by the API's own definition."""

    # OpenAI
    audio: Any = None
    modalities: Any = None
    prediction: Any = None
    web_search_options: Any = None
    service_tier: Any = None
    store: Any = None
    metadata: Any = None
    verbosity: Any = None
    function_call: Any = None  # the deprecated form of tool_choice, for ``functions`` (refused)
    prompt_cache_key: str | None = None  # a hint for routing to a cache; the prefix cache here is automatic
    safety_identifier: str | None = None  # an end-user id for abuse monitoring, like ``user``
    # vLLM
    echo: Any = None
    continue_final_message: Any = None
    add_special_tokens: Any = None  # the template writes BOS; the tokenizer's is never added on top
    documents: Any = None
    chat_template: Any = None
    mm_processor_kwargs: Any = None
    structural_tag: Any = None
    include_reasoning: Any = None

    refused_values: ClassVar[dict[str, tuple[Any, ...]]] = {
        "audio": _ABSENT, "modalities": (None, ["text"]), "prediction": _ABSENT, "web_search_options": _ABSENT,
        "service_tier": (None, "auto", "default"), "store": (None, False), "metadata": _ABSENT,
        "verbosity": _ABSENT, "function_call": (None, "none", "auto"),
        "echo": (None, False), "continue_final_message": (None, False), "add_special_tokens": (None, False),
        "documents": _ABSENT, "chat_template": _ABSENT, "mm_processor_kwargs": _ABSENT,
        "structural_tag": _ABSENT, "include_reasoning": (None, True)}


def refusal_message(name: str, accepted: tuple[Any, ...]) -> str:
    """The 400's message for a refused ``name`` (never echoes the value sent, which may be huge)."""
    shown = [json.dumps(v) for v in accepted if v is not None]
    return f"{name} is not supported by this server; leave it out" + (f" or send {' or '.join(shown)}" if shown else "")
