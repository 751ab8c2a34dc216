"""The OpenAI-compatible HTTP server: routes, the request guard, error mapping, and ``main``.

Run it with ``atom serve [MODEL_DIR]`` or ``python -m atom.entrypoints.openai_server [MODEL_DIR]``.

Endpoints: ``POST /v1/completions``, ``POST /v1/chat/completions``, ``GET /v1/models``,
``GET /health``, ``GET /metrics``. Every error is an OpenAI-style body
``{"error": {"message", "type", "param", "code"}}``:

=====  =====================================================================================
400    malformed JSON (any parse failure: syntax, encoding, integer digit limit, lone surrogates),
       a wrong type or missing field, a size limit (:class:`ServerLimits`), an invalid sampling
       value, an unsupported parameter, a prompt that does not fit ``max_model_len``, an empty prompt
401    ``--api-key`` set and the ``Authorization: Bearer`` header is missing or wrong (/v1/* only)
404    unknown model, unknown route
405    wrong method on a known route
408    the body did not arrive within ``body_timeout``
413    request body over ``max_body_bytes``
500    an unexpected failure while serving that one request (the server keeps running, the
       connection stays open; input nested too deeply for some step is a 400 instead)
503    the engine thread failed (``/health`` also answers 503); over ``max_connections`` (except
       ``GET /health``, see ``connections.py``); ``shutdown_timeout`` ran out during shutdown
=====  =====================================================================================

Every error response is counted in ``atom_request_errors_total{status}``.

The guard is plain ASGI middleware (not ``BaseHTTPMiddleware``, which would buffer streams and
hide client disconnects): it checks the key, then reads at most ``max_body_bytes`` of the body
within ``body_timeout`` and replays it to the app, so an oversized or dribbled body is refused
without being held. Parsing, validation and tokenization then run in a thread pool
(``request_parse.py``), never on the event loop; a large body is decoded and checked in a helper
process first (``body_precheck.py``), so refusing it never holds this process's interpreter lock.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hmac
import json
import sys
import time
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Awaitable, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import BaseModel
from starlette.background import BackgroundTask
from starlette.exceptions import HTTPException as StarletteHTTPException

from atom.entrypoints.async_engine import AsyncEngine
from atom.entrypoints.body_precheck import BodyPrecheck
from atom.entrypoints.limits import ServerLimits
from atom.entrypoints.metrics import CONTENT_TYPE_LATEST, ServerMetrics
from atom.entrypoints.protocol import ApiError, ChatCompletionRequest, CompletionRequest, error_body
from atom.entrypoints.request_parse import parse_body
from atom.entrypoints.serving import OpenAIServing, wait_for_disconnect

__all__ = ["build_app", "main"]

_STATUS_TYPE = {400: "invalid_request_error", 401: "authentication_error", 404: "invalid_request_error",
                405: "invalid_request_error", 408: "invalid_request_error", 413: "invalid_request_error",
                500: "server_error", 503: "server_error"}

ASGIApp = Callable[[dict, Callable[[], Awaitable[dict]], Callable[[dict], Awaitable[None]]], Awaitable[None]]


async def _send_error(send: Callable[[dict], Awaitable[None]], status: int, message: str, code: str,
                      headers: list[tuple[bytes, bytes]] = ()) -> None:
    body = json.dumps(error_body(message, _STATUS_TYPE.get(status, "invalid_request_error"), None, code)).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *headers]})
    await send({"type": "http.response.body", "body": body})


def _bearer_token(header: bytes) -> str | None:
    """The token of ``Authorization: Bearer <token>``; the scheme is case-insensitive (RFC 7235)."""
    scheme, _, token = header.decode("latin-1").strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


class _Guard:
    """API key check, body-size limit and body deadline, ahead of routing (see the module docstring)."""

    def __init__(self, app: ASGIApp, api_key: str | None, limits: ServerLimits, metrics: ServerMetrics) -> None:
        self.app = app
        self.close_requests: Callable[[], int] = lambda: 0  # ends every request in flight (shutdown deadline)
        self.api_key = api_key
        self.limits = limits
        self.metrics = metrics

    async def __call__(self, scope: dict, receive: Callable[[], Awaitable[dict]],
                       send: Callable[[dict], Awaitable[None]]) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.lower(): v for k, v in scope.get("headers", [])}
        if self.api_key is not None and scope["path"].startswith("/v1"):
            given = headers.get(b"authorization")
            token = None if given is None else _bearer_token(given)
            if token is None or not hmac.compare_digest(token.encode(), self.api_key.encode()):
                what = "missing" if given is None else "incorrect"
                return await self._error(send, 401, f"API key {what}: send 'Authorization: Bearer <key>'",
                                         "invalid_api_key", [(b"www-authenticate", b"Bearer")])
        try:
            declared = int(headers.get(b"content-length", b"0"))
        except ValueError:
            return await self._error(send, 400, "Content-Length is not a number", "invalid_header")
        if declared > self.limits.max_body_bytes:
            return await self._error(send, 413, self._too_large(declared), "request_too_large")
        body = b""
        if scope.get("method") in ("POST", "PUT", "PATCH"):
            try:
                body = await asyncio.wait_for(self._read_body(receive, send), self.limits.body_timeout)
            except asyncio.TimeoutError:
                return await self._error(send, 408, f"the request body did not arrive within "
                                                    f"{self.limits.body_timeout:g} s", "request_timeout")
            if body is None:
                return
        return await self.app(scope, _replay(body, receive), send)

    async def _read_body(self, receive: Callable[[], Awaitable[dict]],
                         send: Callable[[dict], Awaitable[None]]) -> bytes | None:
        """The whole body, or None after answering 413 or when the client left."""
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > self.limits.max_body_bytes:
                await self._error(send, 413, self._too_large(size), "request_too_large")
                return None
            if not message.get("more_body", False):
                return b"".join(chunks)

    async def _error(self, send: Callable[[dict], Awaitable[None]], status: int, message: str, code: str,
                     headers: list[tuple[bytes, bytes]] = ()) -> None:
        self.metrics.errors.labels(str(status)).inc()
        await _send_error(send, status, message, code, headers)

    def _too_large(self, size: int) -> str:
        return f"request body of {size} bytes exceeds the limit of {self.limits.max_body_bytes} bytes"


def _replay(body: bytes, receive: Callable[[], Awaitable[dict]]) -> Callable[[], Awaitable[dict]]:
    """A receive() that returns the buffered body once, then defers to the real one (disconnects)."""
    pending = [{"type": "http.request", "body": body, "more_body": False}]

    async def replayed() -> dict:
        return pending.pop() if pending else await receive()

    return replayed


#: Longest error message sent: a message never echoes unbounded input back (a 4 MB model name, say).
MAX_ERROR_CHARS = 1000


def _bounded(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    return text if len(text) <= limit else text[:limit] + "... (cut)"


def _error_response(status: int, message: str, param: str | None = None, code: str | None = None,
                    type: str | None = None) -> JSONResponse:
    body = error_body(_bounded(message), type or _STATUS_TYPE.get(status, "invalid_request_error"),
                      None if param is None else _bounded(param, 200), code)
    return JSONResponse(body, status_code=status)


class _ClientGone(Exception):
    """The client disconnected before its request was answered."""


async def _unless_gone(gone: "asyncio.Future[None]", work: Awaitable[Any]) -> Any:
    """``await work``, unless the client leaves first: then ``work`` is cancelled and _ClientGone raised."""
    task = asyncio.ensure_future(work)
    await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        return task.result()
    task.cancel()
    raise _ClientGone


def build_app(engine: AsyncEngine, *, api_key: str | None = None, limits: ServerLimits | None = None,
              metrics: ServerMetrics | None = None, warm_helpers: bool = False) -> Any:
    """The ASGI app. Its lifespan starts the engine thread and stops it on shutdown; with
    ``warm_helpers`` (``atom serve``) it also starts the body-check processes at once."""
    limits = (limits or ServerLimits()).for_model(engine.max_model_len)
    metrics = metrics or ServerMetrics()
    serving = OpenAIServing(engine, metrics, limits)
    parse_pool = concurrent.futures.ThreadPoolExecutor(limits.parse_threads, thread_name_prefix="atom-parse")
    precheck = BodyPrecheck(limits, engine.max_model_len)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        engine.start()
        if warm_helpers:
            precheck.warm()
        try:
            yield
        finally:
            parse_pool.shutdown(wait=False, cancel_futures=True)
            precheck.close()
            await asyncio.get_running_loop().run_in_executor(None, engine.shutdown)

    app = FastAPI(title="atom", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.engine, app.state.metrics = engine, metrics

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, exc: ApiError) -> JSONResponse:
        metrics.errors.labels(str(exc.status)).inc()
        return _error_response(exc.status, exc.message, exc.param, exc.code, exc.type)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        metrics.errors.labels(str(exc.status_code)).inc()
        return _error_response(exc.status_code, str(exc.detail), code="not_found" if exc.status_code == 404 else None)

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        metrics.errors.labels("500").inc()
        print(f"atom: internal error while serving a request: {exc!r}", file=sys.stderr)
        return _error_response(500, f"internal error: {type(exc).__name__}", code="internal_error")

    def parse_and_prepare(raw: bytes, prep_fn: Callable[[Any], Any], body_model: type[BaseModel]) -> Any:
        """On a parse thread: a large body is checked in the helper process first (body_precheck.py)."""
        precheck.check(raw, body_model)
        return prep_fn(parse_body(raw, body_model, limits, engine.max_model_len))

    async def respond(request: Request, prep_fn: Callable[[Any], Any], body_model: type[BaseModel]) -> Response:
        """Serve one request: whatever it sends, the answer is a response (4xx for bad input, a JSON 500
        for a bug), never an exception past this handler (which would drop the connection)."""
        try:
            return await _respond(request, prep_fn, body_model)
        except ApiError:
            raise  # a 4xx / 503 the app's handler renders
        except RecursionError:  # input nested too deeply for some step of preparing it
            raise ApiError(400, "the request is nested too deeply to process (e.g. tool-call arguments); "
                                "send JSON values nested at most a few hundred levels", code="invalid_request")
        except Exception as exc:  # a bug: answer 500 as JSON and keep the connection, not a dropped socket
            metrics.errors.labels("500").inc()
            print(f"atom: internal error while serving a request: {exc!r}", file=sys.stderr)
            return _error_response(500, f"internal error: {type(exc).__name__}", code="internal_error")

    async def _respond(request: Request, prep_fn: Callable[[Any], Any], body_model: type[BaseModel]) -> Response:
        """The request lives as long as its client: a disconnect watcher runs from the moment the body
        is in (the guard read it, answering a disconnect while reading), through parsing, admission
        (one engine command for all of its sequences) and generation; when the client leaves, every
        sequence the request added is aborted, waiting or running."""
        arrival = time.perf_counter()
        raw = await request.body()  # already read by the guard: replayed at once
        gone = asyncio.ensure_future(wait_for_disconnect(request.receive))
        group = engine.group()
        try:
            prep = await _unless_gone(gone, asyncio.get_running_loop().run_in_executor(
                parse_pool, parse_and_prepare, raw, prep_fn, body_model))
            _, index, states = await _unless_gone(gone, serving.start(prep, group))
            if prep.stream:
                gone.add_done_callback(lambda t: t.cancelled() or group.abort())
                return StreamingResponse(serving.run_stream(prep, group, index, states, arrival),
                                         media_type="text/event-stream", headers={"Cache-Control": "no-cache"},
                                         background=BackgroundTask(_end_stream, gone, group))
            body = await _unless_gone(gone, serving.run_full(prep, group, index, states, arrival))
        except _ClientGone:  # free its KV now instead of finishing the work
            group.abort()
            return Response(status_code=499)
        except BaseException:
            gone.cancel()
            group.abort()
            raise
        gone.cancel()
        return JSONResponse(body)

    async def _end_stream(gone: "asyncio.Future[None]", group: Any) -> None:
        gone.cancel()
        group.abort()

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await respond(request, serving.prepare_completion, CompletionRequest)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await respond(request, serving.prepare_chat, ChatCompletionRequest)

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {"id": engine.model_name, "object": "model", "created": 0, "owned_by": "atom",
                "max_model_len": engine.max_model_len}
        return {"object": "list", "data": [card]}

    @app.get("/health")
    async def health() -> Response:
        if engine.healthy:
            return JSONResponse({"status": "ok"})
        return _error_response(503, f"engine unavailable: {engine.dead_reason or 'not running'}",
                               code="engine_dead")

    @app.get("/metrics")
    async def prometheus() -> Response:
        stats = await engine.call(lambda e: e.stats()) if engine.healthy else None
        return Response(metrics.render(stats, engine.healthy), media_type=CONTENT_TYPE_LATEST)

    guard = _Guard(app, api_key, limits, metrics)
    guard.close_requests = lambda: engine.close_groups(  # the shutdown deadline (launch.Server) calls it
        "the server is shutting down and the time it gives requests in flight (--shutdown-timeout) is over")
    return guard


def main(argv: list[str] | None = None) -> int:
    """``python -m atom.entrypoints.openai_server``: same flags as ``atom serve``."""
    import argparse

    from atom.entrypoints.args import add_serve_arguments
    from atom.entrypoints.launch import serve_from_args

    parser = argparse.ArgumentParser(prog="python -m atom.entrypoints.openai_server",
                                     description="Serve a DeepSeek-V4 model over an OpenAI-compatible API.")
    add_serve_arguments(parser)
    return serve_from_args(parser, parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
