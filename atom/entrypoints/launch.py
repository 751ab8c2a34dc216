"""Start the server: build the config, load the engine, bind, print the URL, serve until stopped.

Kept apart from the routes (``openai_server.py``) because it is the process-level concern: it
owns uvicorn, signals and the console. :class:`Server` is also what the tests run in a thread.

The port is bound before the model loads, so a busy port is reported at once (exit status 2)
instead of after a long load.

Stopping: SIGTERM or Ctrl-C stops accepting, lets requests in flight finish for up to
``shutdown_timeout`` seconds, then ends each one with an error (a stream gets an ``error`` event and
``data: [DONE]``, a plain request a 503), stops the engine, prints ``atom: server stopped`` and
exits 0. (uvicorn re-raises the signal it caught once it is done; the handler installed here
for that moment turns it into a normal return instead of a kill by signal.)
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import socket
import sys
import threading
from typing import Any

import uvicorn

from atom.config import EngineConfig
from atom.entrypoints.args import ServerArgs, engine_config_from_args, server_args_from
from atom.entrypoints.async_engine import AsyncEngine
from atom.entrypoints.connections import RateLimitedLoopErrors, guarded_protocol
from atom.entrypoints.metrics import ServerMetrics
from atom.entrypoints.openai_server import build_app
from atom.model_engine.dp_engine import DataParallelEngine
from atom.model_engine.llm_engine import LLMEngine
from atom.parallel.launch import close_runner, join_launched_ranks, serve_launched_rank

__all__ = ["Server", "load_engine", "serve_from_args", "bind_socket", "describe_replicas", "stop_runner"]

#: The interpreter's thread switch interval in a server process (Python's default is 5 ms). The engine
#: thread gives up the interpreter lock around every tensor operation of a step; while a parse thread
#: or the event loop runs Python code (a large body being read or checked), each of those hand-backs
#: waits up to one interval, so 5 ms turned a few milliseconds of parsing into a step several times
#: longer. 0.5 ms bounds that wait (``docs/serving.md``, stall scenario).
SWITCH_INTERVAL_S = 0.0005

#: Seconds after the shutdown deadline that requests, once told to end, get to send their last bytes
#: before uvicorn cancels what is left.
_CUT_GRACE_S = 2.0


def load_engine(config: EngineConfig, rank_group: Any = None) -> AsyncEngine:
    """``build_engine(config)`` wrapped for the server (the thread starts with the app).

    ``rank_group``: the group ``torchrun`` formed, when this process is its rank 0."""
    from atom.engine_builder import build_engine  # imports torch: only when serving

    return AsyncEngine(build_engine(config, rank_group=rank_group))


class Server(uvicorn.Server):
    """uvicorn server that announces its real URL (``port=0`` picks a free one) once it listens.

    ``url`` is set and ``ready`` is signalled after the socket is bound; ``run_in_thread`` is
    for tests and tools that host the server inside their own process.
    """

    def __init__(self, app: Any, args: ServerArgs, *, announce: bool = True,
                 metrics: ServerMetrics | None = None) -> None:
        lim = args.limits
        on_reject = (lambda status: metrics.errors.labels(str(status)).inc()) if metrics else (lambda status: None)
        protocol = guarded_protocol(lim.max_connections, lim.header_timeout, on_reject)
        super().__init__(uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level, http=protocol,
                                        timeout_keep_alive=lim.keep_alive_timeout,
                                        timeout_graceful_shutdown=lim.shutdown_timeout + _CUT_GRACE_S,
                                        access_log=args.log_level == "debug"))
        self.args = args
        self.announce = announce
        self.url: str | None = None
        self.ready = threading.Event()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        asyncio.get_running_loop().set_exception_handler(RateLimitedLoopErrors())
        await super().startup(sockets)
        if not self.started:
            return
        port = self.args.port
        for server in self.servers:
            for sock in server.sockets:
                port = sock.getsockname()[1]
                break
        self.url = f"http://{self.args.display_host}:{port}"
        if self.announce:
            print(f"atom: serving at {self.url}/v1 (OpenAI-compatible; health {self.url}/health, "
                  f"metrics {self.url}/metrics)", flush=True)
        self.ready.set()

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's graceful shutdown, plus the deadline: after ``shutdown_timeout`` seconds every
        request still in flight is ended by the app (``close_requests``) with an error it can send."""
        close = getattr(self.config.app, "close_requests", None)
        timer = None
        if close is not None:
            timer = asyncio.get_running_loop().call_later(self.args.limits.shutdown_timeout, close)
        try:
            await super().shutdown(sockets)
        finally:
            if timer is not None:
                timer.cancel()

    def run_in_thread(self, timeout: float = 60.0) -> threading.Thread:
        """Start serving in a daemon thread and wait until it listens (raises if it does not)."""
        thread = threading.Thread(target=self.run, name="atom-http", daemon=True)
        thread.start()
        if not self.ready.wait(timeout):
            self.should_exit = True
            raise RuntimeError(f"the server did not start listening within {timeout} s")
        return thread

    def stop(self, thread: threading.Thread, timeout: float = 30.0) -> None:
        self.should_exit = True
        thread.join(timeout)


def describe_replicas(engine: DataParallelEngine, tensor_parallel_size: int) -> list[str]:
    """One line per attention replica: its ranks, its arena (bytes, held and free), its requests running
    and waiting and the prompt tokens its prefix cache served (``/metrics`` has the same, live)."""
    lines = [f"{engine.replicas} attention replicas, each with its own scheduler and KV arena "
             "(--kv-cache-memory each); new requests go to the replica caching the longest prefix of their prompt"]
    t = tensor_parallel_size
    for d, r in enumerate(engine.replica_stats()):
        total = sum(r.arena_bytes.values())
        ranks = f"rank {d * t}" if t == 1 else f"ranks {d * t}..{d * t + t - 1}"
        free = r.arena_bytes.get("free", 0)
        lines.append(f"  replica {d} ({ranks}): arena {total / 2**20:.1f} MiB ({free / 2**20:.1f} MiB free), "
                     f"{r.num_running} running, {r.num_waiting} waiting, {r.hit_tokens} hit tokens")
    return lines


def stop_runner(engine: LLMEngine | DataParallelEngine) -> None:
    """Stop the engine's runner and its workers (nothing to do for a single-rank runner)."""
    if isinstance(engine, DataParallelEngine):
        engine.runner.close()
    else:
        close_runner(engine.runner)


def bind_socket(host: str, port: int) -> socket.socket:
    """A listening-ready TCP socket bound to ``host:port`` (``SO_REUSEADDR``, as uvicorn binds).
    Raises ``OSError`` naming the address when it is taken or cannot be bound."""
    try:
        family, kind, proto, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except OSError as exc:
        raise OSError(f"cannot resolve --host {host!r}: {exc}") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
    except OSError as exc:
        sock.close()
        raise OSError(f"cannot listen on {host}:{port}: {exc.strerror or exc} (is another server using the port? "
                      f"pick another with --port, or --port 0 for any free one)") from None
    sock.set_inheritable(True)
    return sock


def serve_from_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    """Everything ``atom serve`` does after parsing. Bad settings exit with status 2 and the reason."""
    try:
        config = engine_config_from_args(args)
        net = server_args_from(args)
    except ValueError as exc:
        parser.error(str(exc))
    sock = None
    try:
        group = join_launched_ranks(config)
        if group is not None and group.rank > 0:  # a torchrun rank other than 0: run steps, serve nothing
            serve_launched_rank(config, group)
            return 0
        sock = bind_socket(net.host, net.port)  # before the (long) load: a busy port fails at once
        print(f"atom: loading {config.model.path or 'the built-in tiny DeepSeek-V4 model'} ...", file=sys.stderr,
              flush=True)
        engine = load_engine(config, group)
    except (ValueError, OSError) as exc:
        if sock is not None:
            sock.close()
        print(f"atom serve: error: {exc}", file=sys.stderr)
        return 2
    from atom.engine_builder import describe_kv

    sys.setswitchinterval(SWITCH_INTERVAL_S)

    print(f"atom: {describe_kv(engine.engine.runner.views.layout)}", file=sys.stderr, flush=True)
    host_tier = getattr(getattr(engine.engine, "scheduler", None), "bm", None)
    if host_tier is not None and host_tier.host is not None:
        print(f"atom: {host_tier.host.describe()}", file=sys.stderr, flush=True)
    if isinstance(engine.engine, DataParallelEngine):
        for line in describe_replicas(engine.engine, config.parallel.tensor_parallel_size):
            print(f"atom: {line}", file=sys.stderr, flush=True)
    metrics = ServerMetrics()
    server = Server(build_app(engine, api_key=net.api_key, limits=net.limits, metrics=metrics, warm_helpers=True), net, metrics=metrics)
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)  # see the module docstring
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:  # uvicorn re-raises Ctrl-C after its graceful shutdown: that is a clean stop
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)
        stop_runner(engine.engine)
    print("atom: server stopped", file=sys.stderr, flush=True)
    return 0 if server.started else 1
