"""What ``/v1/completions`` and ``/v1/chat/completions`` do, between validation and the wire.

Both endpoints reduce to the same work: a list of prompts (token ids) times ``n`` choices, each
one engine request in a single :class:`~atom.entrypoints.async_engine.RequestGroup`, answered as
one JSON body or as an SSE stream. :class:`OpenAIServing` holds that shared path; the two endpoint
flavours differ only in how prompts are built and how a choice is rendered (:class:`_Flavour`).

Choice ``k`` of prompt ``p`` has index ``p * n + k`` and runs with ``seed + k`` when a seed is
given, so choices differ but the same request always gives the same text. ``usage.prompt_tokens``
counts each prompt once (not once per choice); ``cached_tokens`` is the prefix-cache hit of each
prompt's first choice.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable

from atom.entrypoints.async_engine import AsyncEngine, EngineDeadError, RequestGroup, ServerStoppingError
from atom.entrypoints.metrics import ServerMetrics
from atom.entrypoints.chat_output import ChatOutputParser
from atom.entrypoints.chat_prompt import ChatFormat, prompt_chars, render_chat_prompt
from atom.entrypoints.known_params import refusal_message
from atom.entrypoints.limits import ServerLimits
from atom.entrypoints.logprobs_format import chat_logprobs, completion_logprobs
from atom.entrypoints.protocol import (ApiError, ChatCompletionRequest, CompletionRequest, _SamplingFields, error_body,
                                       usage_dict)
from atom.sampling_params import SamplingParams

if TYPE_CHECKING:
    from atom.output.request_output import RequestOutput, TokenLogprobs

__all__ = ["OpenAIServing", "Prepared"]



@dataclass
class Prepared:
    """A validated request ready to run: prompts as ids, the params of each choice."""

    kind: str  # "completion" | "chat"
    request_id: str
    prompts: list[list[int]]
    params: list[SamplingParams]  # one per choice index k (same for every prompt)
    stream: bool
    include_usage: bool
    echo_texts: list[str] = field(default_factory=list)  # completions with echo: prompt text per prompt
    num_logprobs: int | None = None  # None: no log-probabilities asked for
    chat_format: ChatFormat | None = None  # a DeepSeek-V4-encoded chat: split the answer (chat_output)
    session: str | None = None  # the request's ``user``: a data-parallel engine keeps a session on one replica


@dataclass
class _ChoiceState:
    prompt_index: int
    text: str = ""
    num_tokens: int = 0
    cached: int = 0
    finish_reason: str | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None
    error: str | None = None
    logprobs: list["TokenLogprobs"] = field(default_factory=list)
    logprob_offset: int = 0  # completions: characters of token strings streamed so far
    parser: ChatOutputParser | None = None  # DeepSeek-V4 chats: reasoning / content / tool calls
    num_tool_calls: int = 0

    def chat_delta(self, text: str, finished: bool) -> dict[str, Any]:
        """The chat ``delta`` (or message fields) for ``text``, split when the request asked for it."""
        if self.parser is None:
            return {"content": text} if text else {}
        parts = self.parser.feed(text)
        if finished:  # a "stop" finish closed the answer (end-of-sentence, stop string or stop token id)
            parts = parts.extend(self.parser.finish(ended=self.finish_reason == "stop"))
        self.num_tool_calls += len(parts.tool_calls)
        delta: dict[str, Any] = {}
        if parts.reasoning:
            delta["reasoning_content"] = parts.reasoning
        if parts.content:
            delta["content"] = parts.content
        if parts.tool_calls:
            delta["tool_calls"] = parts.tool_calls
        return delta

    def chat_finish_reason(self) -> str | None:
        return "tool_calls" if self.num_tool_calls and self.finish_reason == "stop" else self.finish_reason


class OpenAIServing:
    """Turns validated requests into engine work and responses. One per app."""

    def __init__(self, engine: AsyncEngine, metrics: ServerMetrics, limits: ServerLimits) -> None:
        self.engine = engine
        self.metrics = metrics
        self.limits = limits
        self.tokenizer = engine.tokenizer
        self.max_seed = 2**63 - 1 - limits.max_n  # choice k runs with seed + k: a signed 64-bit integer

    # ---- validation into Prepared -------------------------------------------------------------
    def check_model(self, name: str) -> None:
        if name != self.engine.model_name:
            shown = name if len(name) <= 200 else name[:200] + "..."
            raise ApiError(404, f"The model `{shown}` does not exist; this server serves "
                                f"`{self.engine.model_name}`.", param="model", code="model_not_found")

    def prepare_completion(self, req: CompletionRequest) -> Prepared:
        self.check_model(req.model)
        prompt = req.prompt
        if isinstance(prompt, str) or (isinstance(prompt, list) and prompt and isinstance(prompt[0], str)):
            texts = [prompt] if isinstance(prompt, str) else list(prompt)
            self._check_chars(sum(len(t) for t in texts), "prompt")
            if any(not t for t in texts):
                raise ApiError(400, "prompt must not be empty", param="prompt")
            try:
                prompts = [self.tokenizer.encode(t) for t in texts]
            except ValueError as exc:
                raise ApiError(400, f"prompt: {exc}", param="prompt") from None
        elif isinstance(prompt, list) and prompt and isinstance(prompt[0], int):
            prompts, texts = [list(prompt)], []
        else:
            prompts, texts = [list(p) for p in prompt], []
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ApiError(400, "prompt must not be empty", param="prompt")
        self._check_token_ids(prompts)
        max_tokens = 16 if req.max_tokens is None else req.max_tokens
        for p in prompts:
            self._check_length(len(p), max_tokens, "prompt", "max_tokens")
        echo = (texts or [self.tokenizer.decode(p) for p in prompts]) if req.echo else []
        return self._prepared("completion", "cmpl", req, prompts, max_tokens, echo)

    def prepare_chat(self, req: ChatCompletionRequest) -> Prepared:
        self.check_model(req.model)
        self._check_chars(prompt_chars(req), "messages")
        try:
            text, chat_format = render_chat_prompt(self.tokenizer, req)
        except ValueError as exc:
            raise ApiError(400, str(exc), param="messages") from None
        try:
            ids = self.tokenizer.encode(text, add_special_tokens=False)
        except ValueError as exc:
            raise ApiError(400, f"messages: {exc}", param="messages") from None
        if not ids:
            raise ApiError(400, "the rendered chat prompt is empty", param="messages")
        max_tokens = req.requested_max_tokens
        if max_tokens is None:
            self._check_length(len(ids), 1, "messages", req.max_tokens_param)
            max_tokens = self.engine.max_model_len - len(ids)
        self._check_length(len(ids), max_tokens, "messages", req.max_tokens_param)
        return self._prepared("chat", "chatcmpl", req, [ids], max_tokens, [], chat_format)

    def _check_chars(self, num_chars: int, param: str) -> None:
        """Before tokenizing or templating: the text must fit ``max_prompt_chars``."""
        if num_chars > self.limits.max_prompt_chars:
            raise ApiError(400, f"the {param} has {num_chars} characters, over the limit of "
                                f"{self.limits.max_prompt_chars}", param=param, code="context_length_exceeded")

    def _prepared(self, kind: str, prefix: str, req: _SamplingFields, prompts: list[list[int]],
                  max_tokens: int, echo: list[str], chat_format: ChatFormat | None = None) -> Prepared:
        lim = self.limits
        self._check_refused(req, chat_format)
        bad = req.unsupported()
        if bad is not None:
            raise ApiError(400, f"{bad} is not supported by this server; leave it out", param=bad,
                           code="unsupported_parameter")
        if not 1 <= req.n <= lim.max_n:
            raise ApiError(400, f"n={req.n} must be between 1 and {lim.max_n}", param="n")
        if len(prompts) * req.n > lim.max_choices:
            raise ApiError(400, f"{len(prompts)} prompts x n={req.n} is {len(prompts) * req.n} sequences; at most "
                                f"{lim.max_choices} per request", param="prompt")
        if req.stream_options is not None and not req.stream:
            raise ApiError(400, "stream_options is only allowed when stream is true", param="stream_options")
        if req.seed is not None and not 0 <= req.seed <= self.max_seed:
            raise ApiError(400, f"seed={req.seed} must be in [0, {self.max_seed}]", param="seed")
        stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
        edits = self._logit_edits(req)
        edits["skip_special_tokens"] = req.skip_special_tokens and chat_format is None  # markers stay for the parser
        params = [self._params(req, max_tokens, stop, k, edits) for k in range(req.n)]
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return Prepared(kind, f"{prefix}-{uuid.uuid4().hex}", prompts, params, req.stream, include_usage, echo,
                        req.num_logprobs(), chat_format, req.user)

    @staticmethod
    def _check_refused(req: _SamplingFields, chat_format: ChatFormat | None) -> None:
        """A known parameter this server does not implement (``known_params``), asked for: 400 naming it."""
        found = req.refused_parameter()
        if found is not None:
            raise ApiError(400, refusal_message(*found), param=found[0], code="unsupported_parameter")
        if chat_format is not None and not req.skip_special_tokens:
            raise ApiError(400, "skip_special_tokens=false is not supported for a chat in the DeepSeek-V4 encoding "
                                "(its markers become reasoning_content and tool_calls); leave it out",
                           param="skip_special_tokens", code="unsupported_parameter")

    def _logit_edits(self, req: _SamplingFields) -> dict[str, Any]:
        """``logit_bias`` / ``stop_token_ids`` as token ids inside the vocabulary, plus the penalties."""
        vocab = self.tokenizer.vocab_size
        bias = []
        for key, value in (req.logit_bias or {}).items():
            if not (key.isascii() and key.isdigit() and len(key) <= 10) or not int(key) < vocab:
                raise ApiError(400, f"logit_bias key {key[:40]!r} is not a token id in [0, {vocab})",
                               param="logit_bias")
            bias.append((int(key), value))
        bad = [t for t in req.stop_token_ids or [] if not 0 <= t < vocab]
        if bad:
            raise ApiError(400, f"stop_token_ids: {bad[0]} is not a token id in [0, {vocab})", param="stop_token_ids")
        top = getattr(req, "top_logprobs", None)
        if top is not None and not getattr(req, "logprobs", False):
            raise ApiError(400, "top_logprobs needs logprobs=true", param="top_logprobs")
        if top is not None:  # the chat's count of alternatives: name it, not the engine's ``logprobs``
            try:
                SamplingParams(logprobs=top)
            except ValueError as exc:
                raise ApiError(400, f"top_logprobs={top} is out of range: {exc}", param="top_logprobs") from None
        edits: dict[str, Any] = dict(logit_bias=tuple(bias), stop_token_ids=tuple(req.stop_token_ids or ()),
                                     min_tokens=req.min_tokens, logprobs=req.num_logprobs())
        for name in ("presence_penalty", "frequency_penalty", "repetition_penalty"):
            if getattr(req, name) is not None:
                edits[name] = getattr(req, name)
        return edits

    @staticmethod
    def _params(req: _SamplingFields, max_tokens: int, stop: list[str], k: int,
                edits: dict[str, Any]) -> SamplingParams:
        fields: dict[str, Any] = dict(max_tokens=max_tokens, stop=tuple(stop), ignore_eos=req.ignore_eos,
                                      include_stop_str_in_output=req.include_stop_str_in_output,
                                      seed=None if req.seed is None else req.seed + k, **edits)
        for name in ("temperature", "top_p", "top_k", "min_p"):
            if getattr(req, name) is not None:
                fields[name] = getattr(req, name)
        if fields.get("top_k") == -1:
            fields["top_k"] = 0  # vLLM's other spelling of "off", which its clients send by default
        try:
            return SamplingParams(**fields)
        except ValueError as exc:
            param = str(exc).split("=", 1)[0] if "=" in str(exc) else None
            raise ApiError(400, str(exc), param=param) from None

    def _check_token_ids(self, prompts: list[list[int]]) -> None:
        vocab = self.tokenizer.vocab_size
        for p in prompts:
            bad = [t for t in p if not 0 <= t < vocab]
            if bad:
                raise ApiError(400, f"token id {bad[0]} is outside the vocabulary [0, {vocab})", param="prompt")

    def _check_length(self, prompt_len: int, max_tokens: int, prompt_param: str, max_param: str) -> None:
        limit = self.engine.max_model_len
        if max_tokens < 1:
            raise ApiError(400, f"{max_param}={max_tokens} must be >= 1", param=max_param)
        if prompt_len >= limit:
            raise ApiError(400, f"This model's maximum context length is {limit} tokens, but the {prompt_param} "
                                f"has {prompt_len} tokens (at most {limit - 1} leave room for one output token).",
                           param=prompt_param, code="context_length_exceeded")
        if prompt_len + max_tokens > limit:
            raise ApiError(400, f"This model's maximum context length is {limit} tokens. However, you requested "
                                f"{prompt_len + max_tokens} tokens ({prompt_len} in the {prompt_param}, {max_tokens} "
                                f"for the completion). Reduce the {prompt_param} or {max_param}.",
                           param=max_param, code="context_length_exceeded")

    # ---- running ------------------------------------------------------------------------------
    async def start(self, prep: Prepared,
                    group: RequestGroup | None = None) -> tuple[RequestGroup, dict[str, int], list[_ChoiceState]]:
        """Submit every choice in one engine command (so all of them are in, waiting or running, and
        one abort of ``group`` removes them all); on a rejection none stays and ApiError is raised."""
        group = group or self.engine.group()
        n = len(prep.params)
        fmt = prep.chat_format
        states = [_ChoiceState(prompt_index=i // n,
                               parser=None if fmt is None else ChatOutputParser(fmt.thinking))
                  for i in range(len(prep.prompts) * n)]
        index = {f"{prep.request_id}-{i}": i for i in range(len(states))}
        try:
            await group.add_all([(rid, prep.prompts[i // n], prep.params[i % n]) for rid, i in index.items()],
                                session=prep.session)
        except ValueError as exc:
            group.abort()
            raise ApiError(400, str(exc), param="prompt" if prep.kind == "completion" else "messages") from None
        except EngineDeadError as exc:
            group.abort()
            raise ApiError(503, f"engine unavailable: {exc}", type="server_error", code="engine_dead") from None
        except BaseException:
            group.abort()
            raise
        return group, index, states

    def _update(self, st: _ChoiceState, out: "RequestOutput", now: float, arrival: float) -> None:
        st.text += out.new_text
        st.logprobs += out.new_logprobs
        st.num_tokens = out.num_output_tokens
        st.cached = out.num_cached_tokens
        if out.new_token_ids:
            if st.first_token_at is None:
                st.first_token_at = now
            st.last_token_at = now
        if out.finished:
            st.finish_reason = out.finish_reason
            st.error = out.error
            self.metrics.observe_request(arrival, st.first_token_at, st.last_token_at, st.num_tokens,
                                         out.finish_reason)

    def _usage(self, prep: Prepared, states: list[_ChoiceState]) -> dict[str, Any]:
        n = len(prep.params)
        return usage_dict(sum(len(p) for p in prep.prompts), sum(s.num_tokens for s in states),
                          sum(states[p * n].cached for p in range(len(prep.prompts))))

    async def run_full(self, prep: Prepared, group: RequestGroup, index: dict[str, int],
                       states: list[_ChoiceState], arrival: float) -> dict[str, Any]:
        """Wait for every choice and build the JSON body."""
        try:
            async for out in group.outputs():
                self._update(states[index[out.request_id]], out, time.perf_counter(), arrival)
        except ServerStoppingError as exc:
            raise ApiError(503, f"{exc}", type="server_error", code="server_shutting_down") from None
        except EngineDeadError as exc:
            raise ApiError(500, f"engine failed: {exc}", type="server_error", code="engine_dead") from None
        failed = [s.error for s in states if s.error]
        if failed:
            raise ApiError(503, f"the engine could not serve this request: {failed[0]}", type="server_error",
                           code="engine_capacity")
        render = _render_chat if prep.kind == "chat" else _render_completion
        choices = [render(i, s, prep, self._logprobs(prep, s, s.logprobs)) for i, s in enumerate(states)]
        return {"id": prep.request_id, "object": "chat.completion" if prep.kind == "chat" else "text_completion",
                "created": int(time.time()), "model": self.engine.model_name, "choices": choices,
                "usage": self._usage(prep, states)}

    async def run_stream(self, prep: Prepared, group: RequestGroup, index: dict[str, int],
                         states: list[_ChoiceState], arrival: float) -> AsyncIterator[str]:
        """SSE events; leaving early (client gone) aborts the unfinished choices via the group."""
        created = int(time.time())
        chunk = _chunk_maker(prep, self.engine.model_name, created)
        try:
            if prep.kind == "chat":
                yield _sse(chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                   "finish_reason": None} for i in range(len(states))]))
            elif prep.echo_texts:
                yield _sse(chunk([_stream_choice(prep, s, i, prep.echo_texts[s.prompt_index], False)
                                  for i, s in enumerate(states)]))
            async for out in group.outputs():
                i = index[out.request_id]
                self._update(states[i], out, time.perf_counter(), arrival)
                if out.error:
                    yield _sse(error_body(f"the engine could not serve this request: {out.error}", "server_error",
                                          None, "engine_capacity"))
                    break
                if out.new_token_ids or out.new_text or out.finished:
                    yield _sse(chunk([_stream_choice(prep, states[i], i, out.new_text, out.finished,
                                                     self._logprobs(prep, states[i], out.new_logprobs))]))
            else:
                if prep.include_usage:
                    yield _sse(chunk([], usage=self._usage(prep, states)))
        except ServerStoppingError as exc:
            yield _sse(error_body(f"{exc}", "server_error", None, "server_shutting_down"))
        except EngineDeadError as exc:
            yield _sse(error_body(f"engine failed: {exc}", "server_error", None, "engine_dead"))
        finally:
            group.abort()
        yield "data: [DONE]\n\n"


    def _logprobs(self, prep: Prepared, st: _ChoiceState, entries: list["TokenLogprobs"]) -> dict[str, Any] | None:
        """The ``logprobs`` object of ``entries`` (None when the request did not ask for them)."""
        if prep.num_logprobs is None:
            return None
        if prep.kind == "chat":
            return chat_logprobs(self.tokenizer, entries)
        obj, st.logprob_offset = completion_logprobs(self.tokenizer, entries, prep.num_logprobs, st.logprob_offset)
        return obj


def _sse(obj: dict[str, Any]) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


def _chunk_maker(prep: Prepared, model: str, created: int) -> Callable[..., dict[str, Any]]:
    obj = "chat.completion.chunk" if prep.kind == "chat" else "text_completion"

    def make(choices: list[dict[str, Any]], usage: dict[str, Any] | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"id": prep.request_id, "object": obj, "created": created, "model": model,
                                "choices": choices}
        if prep.include_usage:
            body["usage"] = usage
        return body

    return make


def _stream_choice(prep: Prepared, st: _ChoiceState, i: int, text: str, finished: bool,
                   logprobs: dict[str, Any] | None = None) -> dict[str, Any]:
    if prep.kind == "chat":
        return {"index": i, "delta": st.chat_delta(text, finished), "logprobs": logprobs,
                "finish_reason": st.chat_finish_reason() if finished else None}
    return {"index": i, "text": text, "logprobs": logprobs, "finish_reason": st.finish_reason if finished else None}


def _render_completion(i: int, s: _ChoiceState, prep: Prepared, logprobs: dict[str, Any] | None) -> dict[str, Any]:
    text = (prep.echo_texts[s.prompt_index] if prep.echo_texts else "") + s.text
    return {"index": i, "text": text, "logprobs": logprobs, "finish_reason": s.finish_reason}


def _render_chat(i: int, s: _ChoiceState, prep: Prepared, logprobs: dict[str, Any] | None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": s.text}
    if s.parser is not None:
        parts = s.chat_delta(s.text, finished=True)
        message = {"role": "assistant", "content": parts.get("content", "" if "tool_calls" not in parts else None),
                   "reasoning_content": parts.get("reasoning_content", "" if prep.chat_format.thinking else None)}
        if "tool_calls" in parts:
            message["tool_calls"] = [{k: v for k, v in c.items() if k != "index"} for c in parts["tool_calls"]]
    return {"index": i, "message": message, "logprobs": logprobs, "finish_reason": s.chat_finish_reason()}


async def wait_for_disconnect(receive: Callable[[], Any]) -> None:
    """Return when the ASGI client disconnects (used to abort non-streaming requests)."""
    while True:
        message = await receive()
        if message.get("type") == "http.disconnect":
            return
        await asyncio.sleep(0)
