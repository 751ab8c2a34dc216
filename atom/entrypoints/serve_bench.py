"""``atom bench serve``: a bounded load generator against a running atom server on this machine.

Each request is a streamed ``/v1/completions`` call whose prompt is given as token ids, so prompt
lengths are exact whatever the tokenizer: the first ``round(prompt_len * shared_prefix_ratio)``
ids are one fixed prefix shared by every request (what the prefix cache can reuse), the rest are
random per request. Requests ask for ``output_len`` tokens with ``ignore_eos``, at temperature 0.
Arrivals are a Poisson process at ``request_rate`` per second (``inf``: as fast as the
``concurrency`` limit allows); everything is seeded, so two runs send the same load.

Reported: request and token throughput; time to first token (TTFT), time per output token after
the first (TPOT) and end-to-end latency as p50 / p90 / p99 in milliseconds; the cached-token ratio
(``prompt_tokens_details.cached_tokens`` / prompt tokens, from each stream's final usage chunk).

The target must be a loopback address and every limit is bounded (see :class:`BenchConfig`):
this is a measuring tool, not a way to load someone else's server.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import math
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from urllib.parse import urlsplit

from atom.validation import require_int

__all__ = ["BenchConfig", "BenchReport", "RequestResult", "run_bench", "add_bench_arguments", "bench_from_args"]

_LOOPBACK_NAMES = ("localhost",)


def _is_loopback(host: str) -> bool:
    if host in _LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class BenchConfig:
    """One benchmark run. Every field is checked; a bad one raises ``ValueError`` naming it."""

    base_url: str = "http://127.0.0.1:8000"
    model: str | None = None  # None: the first model the server lists
    num_requests: int = 64
    concurrency: int = 8
    request_rate: float = math.inf
    prompt_len: int = 128
    output_len: int = 32
    shared_prefix_ratio: float = 0.0
    seed: int = 0
    api_key: str | None = None
    token_low: int = 32  # prompt ids are drawn from [token_low, token_high)
    token_high: int = 127
    timeout_s: float = 600.0

    def __post_init__(self) -> None:
        host = urlsplit(self.base_url).hostname or ""
        if urlsplit(self.base_url).scheme != "http" or not _is_loopback(host):
            raise ValueError(f"base_url={self.base_url!r} must be http:// on a loopback address "
                             "(127.0.0.1, ::1 or localhost)")
        for name, lo, hi in (("num_requests", 1, 100_000), ("concurrency", 1, 1024), ("prompt_len", 1, 1_000_000),
                             ("output_len", 1, 1_000_000), ("token_low", 0, 10**7), ("token_high", 1, 10**7)):
            require_int(name, getattr(self, name), lo, hi)
        if self.token_low >= self.token_high:
            raise ValueError(f"token range [{self.token_low}, {self.token_high}) is empty")
        if not (self.request_rate > 0):
            raise ValueError(f"request_rate={self.request_rate!r} must be > 0 (inf = no pacing)")
        if not 0.0 <= self.shared_prefix_ratio <= 1.0:
            raise ValueError(f"shared_prefix_ratio={self.shared_prefix_ratio!r} must be in [0, 1]")
        if not 0 < self.timeout_s <= 86_400:
            raise ValueError(f"timeout_s={self.timeout_s!r} must be in (0, 86400]")

    @property
    def prefix_len(self) -> int:
        return round(self.prompt_len * self.shared_prefix_ratio)


@dataclass
class RequestResult:
    ok: bool
    prompt_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    ttft_s: float | None = None
    latency_s: float = 0.0
    error: str | None = None

    @property
    def tpot_s(self) -> float | None:
        if self.ttft_s is None or self.output_tokens < 2:
            return None
        return (self.latency_s - self.ttft_s) / (self.output_tokens - 1)


@dataclass
class BenchReport:
    """Aggregates of one run (times in milliseconds)."""

    config: dict
    duration_s: float
    completed: int
    failed: int
    request_throughput: float
    output_throughput: float
    total_token_throughput: float
    cached_token_ratio: float
    ttft_ms: dict[str, float] = field(default_factory=dict)
    tpot_ms: dict[str, float] = field(default_factory=dict)
    e2e_ms: dict[str, float] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        """The report as strict JSON values: a float that is not finite (``request_rate`` inf = no
        pacing) becomes None (``null``), and the API key is left out."""
        data = _finite(asdict(self))
        if data["config"].get("api_key") is not None:
            data["config"]["api_key"] = "(set)"
        return data

    def format(self) -> str:
        lines = [f"requests          {self.completed} ok, {self.failed} failed in {self.duration_s:.2f} s",
                 f"throughput        {self.request_throughput:.2f} req/s, {self.output_throughput:.1f} output tok/s, "
                 f"{self.total_token_throughput:.1f} total tok/s",
                 f"cached tokens     {100 * self.cached_token_ratio:.1f} % of prompt tokens"]
        for name, pct in (("TTFT ms", self.ttft_ms), ("TPOT ms", self.tpot_ms), ("E2E ms", self.e2e_ms)):
            lines.append(f"{name:<18}" + "  ".join(f"{k} {v:.1f}" for k, v in pct.items()))
        lines += [f"error: {e}" for e in self.errors[:5]]
        return "\n".join(lines)


def _finite(value: object) -> object:
    """``value`` with every non-finite float (inf, nan) inside dicts and lists replaced by None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


def percentiles(values: list[float], points: tuple[int, ...] = (50, 90, 99)) -> dict[str, float]:
    """Nearest-rank percentiles (``{"p50": ...}``), empty when there are no values."""
    if not values:
        return {}
    ordered = sorted(values)
    return {f"p{p}": ordered[min(len(ordered) - 1, max(0, math.ceil(p / 100 * len(ordered)) - 1))]
            for p in points}


def make_prompts(cfg: BenchConfig) -> list[list[int]]:
    """The seeded prompts of a run: a shared prefix then a per-request random suffix."""
    rng = random.Random(cfg.seed)
    prefix = [rng.randrange(cfg.token_low, cfg.token_high) for _ in range(cfg.prefix_len)]
    tail = cfg.prompt_len - cfg.prefix_len
    return [prefix + [rng.randrange(cfg.token_low, cfg.token_high) for _ in range(tail)]
            for _ in range(cfg.num_requests)]


async def _one(client: object, url: str, body: dict, headers: dict) -> RequestResult:
    start = time.perf_counter()
    res = RequestResult(ok=False)
    try:
        async with client.stream("POST", url, json=body, headers=headers) as resp:  # type: ignore[attr-defined]
            if resp.status_code != 200:
                res.error = f"HTTP {resp.status_code}: {(await resp.aread()).decode(errors='replace')[:200]}"
                return res
            async for line in resp.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    res.error = chunk["error"].get("message", "stream error")
                    return res
                if chunk.get("choices") and res.ttft_s is None:
                    res.ttft_s = time.perf_counter() - start
                usage = chunk.get("usage")
                if usage:
                    res.prompt_tokens = usage["prompt_tokens"]
                    res.output_tokens = usage["completion_tokens"]
                    res.cached_tokens = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        res.latency_s = time.perf_counter() - start
        res.ok = res.error is None
    except Exception as exc:  # connection refused, timeout, bad JSON: count it, keep going
        res.error = f"{type(exc).__name__}: {exc}"
    return res


async def run_bench(cfg: BenchConfig) -> BenchReport:
    """Send the load of ``cfg`` and aggregate; raises ``ValueError`` if the server is unreachable."""
    import httpx

    headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
    base = cfg.base_url.rstrip("/")
    limits = httpx.Limits(max_connections=cfg.concurrency, max_keepalive_connections=cfg.concurrency)
    async with httpx.AsyncClient(timeout=cfg.timeout_s, limits=limits, trust_env=False) as client:
        model = cfg.model or await _first_model(client, base, headers)
        rng = random.Random(cfg.seed + 1)
        gate = asyncio.Semaphore(cfg.concurrency)

        async def send(ids: list[int]) -> RequestResult:
            body = {"model": model, "prompt": ids, "max_tokens": cfg.output_len, "temperature": 0.0,
                    "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
            async with gate:
                return await _one(client, f"{base}/v1/completions", body, headers)

        tasks = []
        start = time.perf_counter()
        for ids in make_prompts(cfg):
            tasks.append(asyncio.create_task(send(ids)))
            if math.isfinite(cfg.request_rate):
                await asyncio.sleep(rng.expovariate(cfg.request_rate))
        results = await asyncio.gather(*tasks)
        duration = time.perf_counter() - start
    return summarize(cfg, results, duration)


async def _first_model(client: object, base: str, headers: dict) -> str:
    try:
        resp = await client.get(f"{base}/v1/models", headers=headers)  # type: ignore[attr-defined]
    except Exception as exc:
        raise ValueError(f"cannot reach {base}: {exc}; start a server with `atom serve` first") from None
    if resp.status_code != 200:
        raise ValueError(f"{base}/v1/models answered HTTP {resp.status_code}: {resp.text[:200]}")
    return resp.json()["data"][0]["id"]


def summarize(cfg: BenchConfig, results: list[RequestResult], duration: float) -> BenchReport:
    ok = [r for r in results if r.ok]
    out_tokens = sum(r.output_tokens for r in ok)
    prompt_tokens = sum(r.prompt_tokens for r in ok)
    ms = lambda xs: {k: 1000 * v for k, v in percentiles(xs).items()}  # noqa: E731
    duration = max(duration, 1e-9)
    return BenchReport(
        config=asdict(cfg), duration_s=duration, completed=len(ok), failed=len(results) - len(ok),
        request_throughput=len(ok) / duration, output_throughput=out_tokens / duration,
        total_token_throughput=(out_tokens + prompt_tokens) / duration,
        cached_token_ratio=sum(r.cached_tokens for r in ok) / prompt_tokens if prompt_tokens else 0.0,
        ttft_ms=ms([r.ttft_s for r in ok if r.ttft_s is not None]),
        tpot_ms=ms([t for r in ok if (t := r.tpot_s) is not None]),
        e2e_ms=ms([r.latency_s for r in ok]), errors=[r.error for r in results if r.error][:20])


def add_bench_arguments(parser: argparse.ArgumentParser) -> None:
    d = BenchConfig()
    parser.add_argument("--base-url", default=d.base_url, help="server URL, loopback only (default: %(default)s)")
    parser.add_argument("--model", default=None, help="model name (default: the first one the server lists)")
    parser.add_argument("--num-requests", type=int, default=d.num_requests, help="requests to send (default: %(default)s)")
    parser.add_argument("--concurrency", type=int, default=d.concurrency, help="most in flight (default: %(default)s)")
    parser.add_argument("--request-rate", type=float, default=d.request_rate,
                        help="Poisson arrivals per second; inf = no pacing (default: %(default)s)")
    parser.add_argument("--prompt-len", type=int, default=d.prompt_len, help="prompt tokens (default: %(default)s)")
    parser.add_argument("--output-len", type=int, default=d.output_len, help="output tokens (default: %(default)s)")
    parser.add_argument("--shared-prefix-ratio", type=float, default=d.shared_prefix_ratio,
                        help="fraction of each prompt that is a prefix shared by all requests (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=d.seed, help="seed of prompts and arrivals (default: %(default)s)")
    parser.add_argument("--api-key", default=None, help="the server's --api-key, if it has one")
    parser.add_argument("--token-range", default=f"{d.token_low}:{d.token_high}", metavar="LOW:HIGH",
                        help="prompt token ids are drawn from [LOW, HIGH) (default: %(default)s)")
    parser.add_argument("--timeout", type=float, default=d.timeout_s, help="per-request timeout in s")
    parser.add_argument("--output-json", default=None, metavar="PATH", help="also write the report as JSON")
    parser.add_argument("--scenario", choices=("load", "stall"), default="load",
                        help="load: the throughput / latency run above; stall: huge requests against a streaming "
                             "client and /health (atom/entrypoints/stall_bench.py) (default: %(default)s)")
    parser.add_argument("--stall-repeats", type=int, default=3,
                        help="stall scenario: runs of the idle round and of each attack; the gap ratios "
                             "printed are medians over them (default: %(default)s)")
    parser.add_argument("--stall-scale", type=float, default=1.0,
                        help="stall scenario: payload sizes times this, in (0, 1] (default: %(default)s)")
    parser.add_argument("--stall-attacks", default=None, metavar="NAME,NAME",
                        help="stall scenario: run only these attacks, comma-separated (default: all)")


def bench_from_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    try:
        low, high = (int(x) for x in args.token_range.split(":"))
        cfg = BenchConfig(base_url=args.base_url, model=args.model, num_requests=args.num_requests,
                          concurrency=args.concurrency, request_rate=args.request_rate, prompt_len=args.prompt_len,
                          output_len=args.output_len, shared_prefix_ratio=args.shared_prefix_ratio, seed=args.seed,
                          api_key=args.api_key, token_low=low, token_high=high, timeout_s=args.timeout)
    except ValueError as exc:
        parser.error(str(exc))
    if args.scenario == "stall":
        return _stall_from_args(parser, args, cfg)
    try:
        report = asyncio.run(run_bench(cfg))
    except ValueError as exc:
        print(f"atom bench serve: error: {exc}", file=sys.stderr)
        return 1
    print(report.format())
    if args.output_json:
        with open(args.output_json, "w", encoding="utf-8") as f:
            json.dump(report.to_dict(), f, indent=2, default=str, allow_nan=False)
    return 0 if report.failed == 0 else 1


def _stall_from_args(parser: argparse.ArgumentParser, args: argparse.Namespace, cfg: BenchConfig) -> int:
    from atom.entrypoints.stall_bench import format_stall, run_stall_bench

    if not 0 < args.stall_scale <= 1:
        parser.error(f"--stall-scale {args.stall_scale} must be in (0, 1]")
    if not 1 <= args.stall_repeats <= 20:
        parser.error(f"--stall-repeats {args.stall_repeats} must be in 1..20")

    async def run() -> tuple:
        import httpx

        headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
        async with httpx.AsyncClient(timeout=cfg.timeout_s, trust_env=False) as client:
            model = cfg.model or await _first_model(client, cfg.base_url.rstrip("/"), headers)
        return await run_stall_bench(cfg.base_url.rstrip("/"), model, scale=args.stall_scale,
                                     output_len=cfg.output_len, api_key=cfg.api_key, timeout=cfg.timeout_s,
                                     repeats=args.stall_repeats,
                                     attacks=args.stall_attacks.split(",") if args.stall_attacks else None)

    try:
        idle, results = asyncio.run(run())
    except ValueError as exc:
        print(f"atom bench serve: error: {exc}", file=sys.stderr)
        return 1
    print(format_stall(idle, results, args.stall_scale, args.stall_repeats))
    return 0
