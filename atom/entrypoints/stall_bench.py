"""``atom bench serve --scenario stall``: does one client's huge request stall everyone else?

A *victim* streams a completion (token-id prompt, ``output_len`` tokens, greedy) while a prober asks
``/health`` every 50 ms. First the victim runs alone (the idle baseline); then, for each attack, a new
victim starts streaming and the attack is sent once its first token arrived. Every attack fits the
default 4 MiB body limit, so it reaches the checks behind it (sizes times ``scale``; 1.0 is the full
size; the at-limit attacks are sized to ``max_prompt_chars`` itself, whatever ``scale``):

=====================  ======================================================================
control-tiny-400       a tiny request refused at once (``max_tokens: 0``): the gaps' noise floor
text-4MB               one completions request with a 4 MB text prompt
chat-4MB               one chat request with a 4 MB message
chat-tools-4MB         a chat whose one tool has a 4 MB JSON schema
chat-tool-call-id-4MB  a chat whose tool call ``id`` and tool message ``tool_call_id`` are 2 MB each
chat-fn-name-4MB       a chat whose assistant tool call has a 4 MB function name
prompts-256x16KB       one completions request with 256 text prompts of 16 KB
stops-300k-n64         one request with 300,000 stop strings and ``n=64``
token-ids-1M           one request with 1,000,000 token ids
text-at-limit          a text prompt of exactly ``max_prompt_chars`` characters (it is tokenized)
chat-at-limit          a chat message that brings the chat to exactly ``max_prompt_chars``
=====================  ======================================================================

``max_prompt_chars`` is taken as the server's default, ``PROMPT_CHARS_PER_TOKEN`` x its
``max_model_len`` (from ``/v1/models``): run the bench against a server with default limits.

Printed per attack: the status it got, the victim's median and worst inter-token gap during the
attack as ratios to its idle median, the worst ``/health`` latency, and whether the attack met the
target: worst gap at most 2x the idle median and ``/health`` always under 100 ms. With ``repeats``
runs per attack the gap ratios are medians over the runs (see :func:`run_stall_bench`). It is a benchmark
(it prints figures), not a test.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable

from atom.entrypoints.limits import PROMPT_CHARS_PER_TOKEN

__all__ = ["StallResult", "run_stall_bench", "ATTACKS", "MAX_GAP_RATIO", "MAX_HEALTH_MS"]


_MB4 = 4_000_000


def _control(scale: float, model: str, limit: int) -> dict[str, Any]:
    return {"model": model, "prompt": "x", "max_tokens": 0}  # a tiny request refused at once: the noise floor


def _text_prompt(scale: float, model: str, limit: int) -> dict[str, Any]:
    return {"model": model, "prompt": "x" * int(_MB4 * scale), "max_tokens": 1}


def _chat_message(scale: float, model: str, limit: int) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": "y" * int(_MB4 * scale)}], "max_tokens": 1}


def _chat_tools(scale: float, model: str, limit: int) -> dict[str, Any]:
    schema = {"type": "object", "properties": {"q": {"type": "string", "description": "t" * int(_MB4 * scale)}}}
    return {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1,
            "tools": [{"type": "function", "function": {"name": "f", "parameters": schema}}]}


def _call_history(call_id: str, name: str) -> list[dict[str, Any]]:
    call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": "{}"}}
    return [{"role": "user", "content": "hi"}, {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call_id, "content": "ok"}]


def _chat_tool_call_id(scale: float, model: str, limit: int) -> dict[str, Any]:
    return {"model": model, "messages": _call_history("i" * int(_MB4 * scale / 2), "f"), "max_tokens": 1}


def _chat_function_name(scale: float, model: str, limit: int) -> dict[str, Any]:
    return {"model": model, "messages": _call_history("c1", "n" * int(_MB4 * scale)), "max_tokens": 1}


def _many_prompts(scale: float, model: str, limit: int) -> dict[str, Any]:
    return {"model": model, "prompt": ["z" * int(16_000 * scale)] * 256, "max_tokens": 1}


def _many_stops(scale: float, model: str, limit: int) -> dict[str, Any]:
    return {"model": model, "prompt": "stop", "max_tokens": 4, "n": 64,
            "stop": [f"s{i}" for i in range(int(300_000 * scale))]}


def _token_ids(scale: float, model: str, limit: int) -> dict[str, Any]:
    return {"model": model, "prompt": [65] * int(1_000_000 * scale), "max_tokens": 1}


def _text_at_limit(scale: float, model: str, limit: int) -> dict[str, Any]:
    return {"model": model, "prompt": "w" * limit, "max_tokens": 1}


def _chat_at_limit(scale: float, model: str, limit: int) -> dict[str, Any]:
    fixed = 1 + len("role") + len("user") + len("content")  # the list, and every string of it, keys included
    return {"model": model, "messages": [{"role": "user", "content": "v" * (limit - fixed)}], "max_tokens": 1}


ATTACKS: dict[str, Callable[[float, str, int], dict[str, Any]]] = {
    "control-tiny-400": _control, "text-4MB": _text_prompt, "chat-4MB": _chat_message, "chat-tools-4MB": _chat_tools,
    "chat-tool-call-id-4MB": _chat_tool_call_id, "chat-fn-name-4MB": _chat_function_name,
    "prompts-256x16KB": _many_prompts, "stops-300k-n64": _many_stops, "token-ids-1M": _token_ids,
    "text-at-limit": _text_at_limit, "chat-at-limit": _chat_at_limit}

#: The target every attack must meet: the victim's worst gap over its idle median, /health's worst.
MAX_GAP_RATIO, MAX_HEALTH_MS = 2.0, 100.0


@dataclass(frozen=True)
class StallResult:
    attack: str
    status: int
    body_bytes: int
    median_gap_ratio: float
    max_gap_ratio: float
    health_max_ms: float

    @property
    def meets_target(self) -> bool:
        return self.max_gap_ratio <= MAX_GAP_RATIO and self.health_max_ms < MAX_HEALTH_MS

    def line(self) -> str:
        return (f"{self.attack:<22} {self.status:>6} {self.body_bytes / 1e6:>8.2f} {self.median_gap_ratio:>10.2f} "
                f"{self.max_gap_ratio:>9.2f} {self.health_max_ms:>11.1f}  {'yes' if self.meets_target else 'NO'}")


async def _victim(client: Any, base: str, model: str, output_len: int, headers: dict, first: asyncio.Event,
                  stamps: list[float]) -> None:
    body = {"model": model, "prompt": [66] * 16, "max_tokens": output_len, "temperature": 0, "stream": True,
            "ignore_eos": True}
    async with client.stream("POST", f"{base}/v1/completions", json=body, headers=headers) as resp:
        async for line in resp.aiter_lines():
            if line.startswith("data: {"):
                stamps.append(time.perf_counter())
                first.set()


async def _prober(client: Any, base: str, stop: asyncio.Event, latencies: list[float]) -> None:
    while not stop.is_set():
        t0 = time.perf_counter()
        await client.get(f"{base}/health")
        latencies.append(time.perf_counter() - t0)
        await asyncio.sleep(0.05)


def _gaps(stamps: list[float], lo: float = -1.0, hi: float = float("inf")) -> list[float]:
    return [b - a for a, b in zip(stamps, stamps[1:]) if b >= lo and a <= hi]


def _send_attack(sender: Any, url: str, payload: bytes, headers: dict) -> int:
    """The attack goes out from its own thread and connection, so sending a 4 MB body never delays the
    victim's reader (which runs on this process's event loop). ``sender`` is an ``httpx.Client`` made
    before the victim starts: making one loads the CA bundle, tens of ms that hold this process's
    interpreter lock and would show up as a gap in the victim's stream that the server did not cause."""
    return sender.post(url, content=payload, headers={**headers, "content-type": "application/json"}).status_code


async def _round(client: Any, sender: Any, base: str, model: str, output_len: int, headers: dict,
                 attack: dict[str, Any] | None) -> tuple[list[float], list[float], int, float, float]:
    payload = b"" if attack is None else json.dumps(attack).encode()
    path = "/v1/chat/completions" if attack is not None and "messages" in attack else "/v1/completions"
    stamps, latencies, first, stop = [], [], asyncio.Event(), asyncio.Event()
    victim = asyncio.ensure_future(_victim(client, base, model, output_len, headers, first, stamps))
    prober = asyncio.ensure_future(_prober(client, base, stop, latencies))
    await first.wait()
    status, start = 0, time.perf_counter()
    if attack is not None:
        status = await asyncio.to_thread(_send_attack, sender, f"{base}{path}", payload, headers)
    end = time.perf_counter()
    await victim
    stop.set()
    await prober
    return stamps, latencies, status, start, end


async def _max_model_len(client: Any, base: str, headers: dict) -> int:
    resp = await client.get(f"{base}/v1/models", headers=headers)
    resp.raise_for_status()
    return int(resp.json()["data"][0]["max_model_len"])


async def run_stall_bench(base: str, model: str, *, scale: float = 1.0, output_len: int = 64,
                          api_key: str | None = None, timeout: float = 300.0,
                          repeats: int = 1, attacks: list[str] | None = None) -> tuple[float, list[StallResult]]:
    """``(idle median inter-token gap in s, one result per attack)``; ``attacks`` picks some of
    :data:`ATTACKS` by name (default: all, in the table's order). With ``repeats`` > 1 the idle
    round and each attack run that many times: the idle median pools every idle gap, an attack's
    ratios are the medians over its runs and its ``/health`` figure the worst of them (on a shared
    machine one run's worst gap is mostly other processes' noise; the control row shows its size)."""
    import httpx

    if repeats < 1:
        raise ValueError(f"repeats={repeats} must be >= 1")
    unknown = sorted(set(attacks or ()) - set(ATTACKS))
    if unknown:
        raise ValueError(f"unknown attack(s) {', '.join(unknown)}; known: {', '.join(ATTACKS)}")
    chosen = [name for name in ATTACKS if attacks is None or name in attacks]
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    with httpx.Client(timeout=timeout, trust_env=False) as sender:
        async with httpx.AsyncClient(timeout=timeout, limits=httpx.Limits(max_connections=16),
                                     trust_env=False) as client:
            limit = PROMPT_CHARS_PER_TOKEN * await _max_model_len(client, base, headers)
            idle_gaps: list[float] = []
            for _ in range(repeats):
                stamps, _, _, _, _ = await _round(client, sender, base, model, output_len, headers, None)
                idle_gaps += _gaps(stamps)
            idle = statistics.median(idle_gaps)
            results = []
            for name in chosen:
                attack = ATTACKS[name](scale, model, limit)
                runs = []
                for _ in range(repeats):
                    stamps, latencies, status, start, end = await _round(client, sender, base, model, output_len,
                                                                         headers, attack)
                    during = _gaps(stamps, start, max(end, start + 4 * idle)) or _gaps(stamps)
                    runs.append((status, statistics.median(during) / idle, max(during) / idle, 1000 * max(latencies)))
                results.append(StallResult(name, runs[-1][0], len(json.dumps(attack)),
                                           statistics.median(r[1] for r in runs), statistics.median(r[2] for r in runs),
                                           max(r[3] for r in runs)))
    return idle, results


def format_stall(idle: float, results: list[StallResult], scale: float, repeats: int = 1) -> str:
    runs = f", median of {repeats} runs each" if repeats > 1 else ""
    head = (f"stall scenario (sizes x {scale:g}{runs}); victim idle median inter-token gap {1000 * idle:.1f} ms\n"
            f"{'attack':<22} {'status':>6} {'body MB':>8} {'median gap':>10} {'max gap':>9} {'health ms':>11}  "
            f"target")
    return "\n".join([head, *(r.line() for r in results)])
