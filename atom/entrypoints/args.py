"""Command-line flags of ``atom serve`` and their translation into an :class:`EngineConfig`.

The flags follow ``vllm serve``. The CLI builds exactly one thing from them, an ``EngineConfig``
(STYLE rule 5), plus the network settings of the server itself (:class:`ServerArgs`). Bad values
fail at parse time with a message naming the flag; ``EngineConfig`` checks the rest.
"""

from __future__ import annotations

import argparse
import ipaddress
import re
from dataclasses import dataclass

from atom import envs
from atom.config import (DTYPES, EXECUTOR_BACKENDS, HOST_KV_WRITE_POLICIES, KV_CACHE_DTYPES, MAX_SPECULATIVE_TOKENS,
                         QUANT_SIM, CacheConfig, EngineConfig, ModelConfig, ParallelConfig, SchedulerConfig)
from atom.entrypoints.limits import PROMPT_CHARS_PER_TOKEN, ServerLimits
from atom.model_engine.dp_engine import check_data_parallel_config

__all__ = ["parse_bytes", "add_serve_arguments", "engine_config_from_args", "ServerArgs", "server_args_from",
           "limits_from_args"]

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(text: str) -> int:
    """``"1073741824"``, ``"2GiB"``, ``"512MiB"``, ``"1.5GB"`` -> bytes (an integer > 0).

    Binary units (KiB, MiB, GiB, TiB) are powers of 1024, decimal ones (KB, MB, GB, TB) of 1000.
    Raises ``ValueError`` listing the accepted forms.
    """
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(text))
    unit = m.group(2).lower() if m else None
    if m is None or unit not in _UNITS:
        raise ValueError(f"{text!r} is not a size; use bytes (1073741824) or a number with a unit: "
                         "KiB, MiB, GiB, TiB (powers of 1024) or KB, MB, GB, TB (powers of 1000)")
    value = int(float(m.group(1)) * _UNITS[unit])
    if value <= 0:
        raise ValueError(f"{text!r} must be more than 0 bytes")
    return value


def _size_arg(text: str) -> int:
    try:
        return parse_bytes(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _host_gib(text: str) -> int:
    """``--host-kv-cache-memory``: GiB as a number (``1``, ``0.5``; 0 = off) or a size with a unit (``512MiB``); bytes."""
    try:
        gib = float(text)
    except ValueError:
        return _size_arg(text)
    if not gib >= 0 or gib == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be a number of GiB >= 0 (0 = no host tier) or a size like 512MiB")
    return int(gib * (1 << 30))


def _fraction(text: str) -> float:
    """A number in (0, 1] (``--gpu-memory-utilization``)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number; expected a fraction in (0, 1]") from None
    if not 0.0 < value <= 1.0:
        raise argparse.ArgumentTypeError(f"{text} is outside (0, 1]")
    return value


def _int_at_least(minimum: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{text!r} must be >= {minimum}")
        return value
    return parse


_positive_int = _int_at_least(1)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} must be a positive number of seconds")
    return value
_nonneg_int = _int_at_least(0)


def _port(text: str) -> int:
    value = _nonneg_int(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port (0..65535; 0 picks a free one)")
    return value


def _spec_tokens(text: str) -> int:
    value = _nonneg_int(text)
    if value > MAX_SPECULATIVE_TOKENS:
        raise argparse.ArgumentTypeError(f"{text!r} drafts: accepted 0 (off) to {MAX_SPECULATIVE_TOKENS}")
    return value


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``atom serve`` flags to ``parser``."""
    d = EngineConfig()
    ds, dc, dm = d.scheduler, d.cache, d.model
    parser.add_argument("model", nargs="?", default=None, metavar="MODEL_DIR",
                        help="checkpoint directory (config.json, safetensors, tokenizer.json) or a Hugging Face "
                             "repo id; omit it to serve the built-in tiny DeepSeek-V4 model")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    parser.add_argument("--port", type=_port, default=8000, help="port (default: %(default)s; 0 = any free port)")
    parser.add_argument("--api-key", default=None,
                        help="require 'Authorization: Bearer KEY' on /v1/* (default: $ATOM_API_KEY, else no key; "
                             "prefer the variable: arguments are visible in ps)")
    parser.add_argument("--max-model-len", type=_positive_int, default=ds.max_model_len,
                        help="longest prompt + output in tokens (default: %(default)s)")
    parser.add_argument("--max-num-seqs", type=_positive_int, default=ds.max_num_seqs,
                        help="most requests running at once (default: %(default)s)")
    parser.add_argument("--max-num-batched-tokens", type=_positive_int, default=ds.max_num_batched_tokens,
                        help="token budget of one engine step (default: %(default)s)")
    parser.add_argument("--speculative-num-tokens", type=_spec_tokens, default=ds.speculative_num_tokens,
                        help=f"speculative decoding: drafts from the model's MTP layer verified per decoding request "
                             f"and step, 1..{MAX_SPECULATIVE_TOKENS}; 0 = off (default: %(default)s)")
    parser.add_argument("--no-overlap", dest="overlap", action="store_false", default=ds.overlap,
                        help="run schedule, forward and postprocess one after another; by default the next step "
                             "is scheduled while the current one runs, with the same outputs (steps with "
                             "speculative decoding never overlap; default: overlap on)")
    parser.add_argument("--kv-cache-memory", type=_size_arg, default=dc.kv_cache_bytes, metavar="SIZE",
                        help="bytes for the KV arena, e.g. 2GiB or 512MiB (default: 1GiB)")
    parser.add_argument("--gpu-memory-utilization", type=_fraction, default=dc.gpu_memory_utilization,
                        metavar="F", help="on a GPU: give the KV arena F x the device's memory minus the weights, "
                                          "a profiled step's peak and the CUDA-graph pool (printed at start-up), "
                                          "instead of --kv-cache-memory; F in (0, 1] (default: off)")
    parser.add_argument("--host-kv-cache-memory", type=_host_gib, default=dc.host_kv_cache_bytes, metavar="GIB",
                        help="host memory (GiB, or a size like 512MiB) for a second KV tier: prefix blocks the "
                             "arena evicts are kept there and restored exactly on a later hit; pinned on a GPU "
                             "(default: 0 = off; see docs/prefix_cache.md)")
    parser.add_argument("--host-kv-write-policy", choices=HOST_KV_WRITE_POLICIES, default=dc.host_kv_write_policy,
                        help="when the host tier copies a prefix block: 'back' = when the arena evicts it, "
                             "'through' = also as soon as a hit claims it for the --host-kv-write-through-hits-th "
                             "time (default: %(default)s)")
    parser.add_argument("--host-kv-write-through-hits", type=_int_at_least(1), default=dc.host_kv_write_through_hits,
                        metavar="N", help="with --host-kv-write-policy through: the hit that copies a block "
                                          "(default: %(default)s)")
    parser.add_argument("--block-size", type=_nonneg_int, default=dc.block_size,
                        help="tokens per KV block; 0 = the model's own (default: %(default)s)")
    parser.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction,
                        default=dc.enable_prefix_caching, help="reuse KV of shared prompt prefixes (default: on)")
    parser.add_argument("--served-model-name", default=None,
                        help="model name clients must send (default: the model directory's name)")
    parser.add_argument("--seed", type=_nonneg_int, default=dm.seed, help="engine seed (default: %(default)s)")
    parser.add_argument("--device", default=dm.device,
                        help="auto, cpu, cuda[:N] or rocm[:N] (default: auto = a GPU when visible, else cpu)")
    parser.add_argument("--dtype", default=dm.dtype, choices=list(DTYPES),
                        help="activations and unquantized weights (default: auto = bfloat16 on a GPU, float32 on "
                             "the CPU; float64 = a CPU-only verification mode)")
    parser.add_argument("--quant-sim", default=dm.quant_sim, choices=list(QUANT_SIM),
                        help="FP8/FP4 round trips of the release on KV rows, indexer and GEMM inputs (default: "
                             "auto = on when the checkpoint declares quantization)")
    parser.add_argument("--enforce-eager", action="store_true",
                        help="run every step eagerly; without it a GPU replays decode steps from CUDA graphs "
                             "captured per batch-size bucket (the CPU always runs eagerly)")
    parser.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES, default=dc.kv_cache_dtype,
                        help="KV rows stored in the arena: fp8 (fp8_ds_mla rows + FP8 indexer keys), bf16 or fp32; "
                             "auto = fp8 on a GPU for a quantized checkpoint, else fp32 (default: %(default)s)")
    parser.add_argument("--tensor-parallel-size", "-tp", type=_positive_int, default=1,
                        help="ranks that split the model: query heads, output groups, vocabulary and experts "
                             "(default: %(default)s; see docs/parallelism.md)")
    parser.add_argument("--data-parallel-size", "-dp", type=_positive_int, default=1,
                        help="attention replicas, each of --tensor-parallel-size ranks with its own requests, "
                             "scheduler and KV arena (the group's KV grows with them); the routed experts are "
                             "split over all dp x tp ranks (default: %(default)s; see docs/parallelism.md)")
    parser.add_argument("--enable-expert-parallel", action="store_true",
                        help="partition the routed experts whole across the ranks instead of splitting each one")
    parser.add_argument("--distributed-executor-backend", choices=EXECUTOR_BACKENDS, default="mp",
                        help="mp: atom serve spawns its workers on this machine; external_launcher: every rank is "
                             "started by torchrun (multi-node) (default: %(default)s)")
    parser.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"],
                        help="server log level (default: %(default)s)")
    _add_limit_arguments(parser)


#: (flag, ServerLimits field, parser, help) of the request and connection limits.
_LIMIT_FLAGS = (
    ("--max-body-bytes", "max_body_bytes", _size_arg, "largest request body (413 beyond)"),
    ("--max-prompt-chars", "max_prompt_chars", _positive_int, "characters of a request's text prompts, or of "
                                                              "what a chat brings to its prompt (messages, tools, "
                                                              "response_format, ...), checked before templating "
                                                              "or tokenizing"),
    ("--max-prompts", "max_prompts", _positive_int, "prompts in one completions request"),
    ("--max-messages", "max_messages", _positive_int, "messages in one chat request"),
    ("--max-stop-strings", "max_stop_strings", _positive_int, "stop strings per request"),
    ("--max-stop-chars", "max_stop_chars", _positive_int, "characters of one stop string"),
    ("--max-logit-bias", "max_logit_bias", _positive_int, "entries of logit_bias"),
    ("--max-stop-token-ids", "max_stop_token_ids", _positive_int, "entries of stop_token_ids"),
    ("--max-n", "max_n", _positive_int, "n and best_of"),
    ("--max-choices", "max_choices", _positive_int, "sequences one request may start (prompts x n)"),
    ("--max-connections", "max_connections", _positive_int, "open connections; one beyond gets 503 and is closed"),
    ("--header-timeout", "header_timeout", _positive_float, "seconds to send a request's headers"),
    ("--body-timeout", "body_timeout", _positive_float, "seconds to send a request's body (408 beyond)"),
    ("--keep-alive-timeout", "keep_alive_timeout", _positive_float, "seconds an idle connection stays open"),
    ("--shutdown-timeout", "shutdown_timeout", _positive_float, "seconds SIGTERM / Ctrl-C waits for requests "
                                                                 "in flight"),
)


def _add_limit_arguments(parser: argparse.ArgumentParser) -> None:
    d = ServerLimits()
    group = parser.add_argument_group("request and connection limits")
    for flag, field, parse, doc in _LIMIT_FLAGS:
        default = "%(default)s" if getattr(d, field) is not None else f"{PROMPT_CHARS_PER_TOKEN} x --max-model-len"
        group.add_argument(flag, type=parse, default=getattr(d, field), dest=field,
                           help=f"{doc} (default: {default})")


def limits_from_args(args: argparse.Namespace) -> ServerLimits:
    """The :class:`ServerLimits` the flags give (``ValueError`` on a bad combination)."""
    return ServerLimits(**{field: getattr(args, field) for _, field, _, _ in _LIMIT_FLAGS})


def engine_config_from_args(args: argparse.Namespace) -> EngineConfig:
    """The one config the CLI builds (retention settings from the environment). Raises
    ``ValueError`` (from the configs) on bad combinations."""
    config = EngineConfig(
        model=ModelConfig(path=args.model, served_model_name=args.served_model_name, seed=args.seed,
                          device=args.device, dtype=args.dtype, quant_sim=args.quant_sim,
                          enforce_eager=args.enforce_eager),
        scheduler=SchedulerConfig(max_num_batched_tokens=args.max_num_batched_tokens,
                                  max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len,
                                  speculative_num_tokens=args.speculative_num_tokens, overlap=args.overlap),
        cache=CacheConfig.from_env(envs.load(), kv_cache_bytes=args.kv_cache_memory, block_size=args.block_size,
                                   enable_prefix_caching=args.enable_prefix_caching,
                                   kv_cache_dtype=args.kv_cache_dtype,
                                   gpu_memory_utilization=args.gpu_memory_utilization,
                                   host_kv_cache_bytes=args.host_kv_cache_memory,
                                   host_kv_write_policy=args.host_kv_write_policy,
                                   host_kv_write_through_hits=args.host_kv_write_through_hits),
        parallel=ParallelConfig(tensor_parallel_size=args.tensor_parallel_size,
                                data_parallel_size=args.data_parallel_size,
                                enable_expert_parallel=args.enable_expert_parallel,
                                distributed_executor_backend=args.distributed_executor_backend))
    check_data_parallel_config(config)
    return config


@dataclass(frozen=True)
class ServerArgs:
    """Network settings of the HTTP server (not part of the engine's config)."""

    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    log_level: str = "info"
    limits: ServerLimits = ServerLimits()

    def __post_init__(self) -> None:
        if not self.host:
            raise ValueError("host must not be empty (e.g. 127.0.0.1, or 0.0.0.0 for every interface)")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port={self.port} must be in 0..65535")
        if self.api_key is not None and not self.api_key.strip():
            raise ValueError("api_key must not be blank; omit --api-key to serve without one")

    @property
    def display_host(self) -> str:
        try:
            return f"[{self.host}]" if ipaddress.ip_address(self.host).version == 6 else self.host
        except ValueError:
            return self.host


def server_args_from(args: argparse.Namespace) -> ServerArgs:
    """Network settings from the flags; the key falls back to ``ATOM_API_KEY`` (read via ``atom.envs``)."""
    api_key = args.api_key if args.api_key is not None else (envs.load().api_key or None)
    return ServerArgs(host=args.host, port=args.port, api_key=api_key, log_level=args.log_level,
                      limits=limits_from_args(args).for_model(args.max_model_len))
