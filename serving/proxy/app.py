"""The proxy itself: a raw ASGI app that authenticates, admits and forwards to the engine.

Request path, in order (each step answers without touching the engine when it says no):
1. route: the raw path bytes must equal one of ``ROUTES`` exactly (404 otherwise, 405 for a
   known path with the wrong method); no decoding or normalising, so ``//v1/...``,
   ``/v1/../metrics``, ``%2e`` or ``/V1/...`` never match;
2. key: ``Authorization: Bearer <key>`` (401 missing/malformed, 403 unknown);
3. readiness (503 + Retry-After) and the in-flight cap (429 + Retry-After);
4. body: size (413) and JSON object check (400);
5. forward over the pooled client; SSE is relayed piece by piece with keep-alive comments
   (usage-only chunks the client did not ask for are counted, then dropped: ``sse.py``),
   other bodies are read whole (so usage can be counted and a broken body becomes a 502).

The access log never holds an unmatched path's text (a client may have put its key in it):
only ``path_fingerprint`` and the length.

See docs/proxy.md for the behaviour contract and the measured overhead.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import itertools
import json
import logging
import os
import re
import time
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from json.encoder import encode_basestring_ascii as _json_str  # quoted, escaped, ASCII
from typing import Any

from serving.proxy.keys import KeyRing, parse_bearer
from serving.proxy.logs import BatchingStreamHandler
from serving.proxy.metrics import Metrics
from serving.proxy.sse import EVENT_ENDS, UsageChunkFilter
from serving.proxy.upstream import (
    ConnectFailed,
    UpstreamBroken,
    UpstreamClient,
    UpstreamError,
    UpstreamResponse,
    UpstreamTimeout,
)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

access_log = logging.getLogger("serving.proxy.access")
event_log = logging.getLogger("serving.proxy")

_ENGINE, _HEALTH, _READY, _METRICS = range(4)


@dataclass(frozen=True, slots=True)
class Route:
    path: bytes
    name: str  # metric/log label
    method: str
    kind: int
    usage: bool = False  # responses carry an OpenAI ``usage`` object


ROUTES: dict[bytes, Route] = {
    r.path: r
    for r in (
        Route(b"/v1/chat/completions", "chat_completions", "POST", _ENGINE, usage=True),
        Route(b"/v1/completions", "completions", "POST", _ENGINE, usage=True),
        Route(b"/v1/embeddings", "embeddings", "POST", _ENGINE, usage=True),
        Route(b"/v1/models", "models", "GET", _ENGINE),
        Route(b"/health", "health", "GET", _HEALTH),
        Route(b"/ready", "ready", "GET", _READY),
        Route(b"/metrics", "metrics", "GET", _METRICS),
    )
}
_UNMATCHED = Route(b"", "unmatched", "", -1)
# Access-log "path" fields per route: a matched path is one of ROUTES (a constant); an unmatched
# one is never written out (a client may have put its key in it): see ``path_fingerprint``.
_LOGGED_PATH = {
    r.name: f'"path":"{r.path.decode()}","path_sha256":null,"path_len":{len(r.path)}'
    for r in ROUTES.values()
}


def path_fingerprint(raw_path: bytes) -> str:
    """What the access log keeps of an unmatched path: the first 16 hex digits of its sha256
    (compare with ``printf %s PATH | sha256sum``), never the text."""
    return hashlib.sha256(raw_path).hexdigest()[:16]


# Client request headers passed to the engine; everything else (Authorization, cookies,
# Modal-Key/Secret, hop-by-hop headers) stays at the proxy.
# POST bodies always go with "content-type: application/json" (they were validated as JSON).
_FORWARD_HEADERS = frozenset({b"accept", b"user-agent", b"traceparent", b"tracestate"})
# Engine response headers the proxy replaces or that are hop-by-hop.
# Hop-by-hop (RFC 9110 7.6.1, plus the obsolete proxy-connection) and what the proxy sets itself;
# headers the engine names in its own ``Connection`` header are dropped too.
_DROP_RESPONSE_HEADERS = frozenset(
    {
        b"connection", b"keep-alive", b"transfer-encoding", b"te", b"trailer", b"upgrade",
        b"proxy-authenticate", b"proxy-authorization", b"proxy-connection",
        b"content-length", b"date", b"server", b"x-request-id", b"x-accel-buffering",
        b"cache-control",
    }
)  # fmt: skip
_REQUEST_ID_RE = re.compile(rb"[A-Za-z0-9._:-]{1,128}")
# Starts with its literal quote so the regex engine can skip ahead to each quote; a lookbehind
# for the backslash of an escaped quote (`(?<!\\)`) made it try every position (3x slower on a
# typical answer); `_scan_usage` checks that byte itself.
_USAGE_RE = re.compile(rb'"(prompt_tokens|completion_tokens)"\s*:\s*(\d{1,15})(?![\d.eE])')
KEEPALIVE_COMMENT = b": keep-alive\n\n"
_STREAM_HEADERS = [(b"x-accel-buffering", b"no"), (b"cache-control", b"no-cache")]
_JSON = (b"content-type", b"application/json")


@dataclass(slots=True)
class ProxyConfig:
    """Settings; the CLI flags map one to one (see ``python -m serving.proxy --help``)."""

    upstream: str
    max_in_flight: int = 256
    max_body_bytes: int = 4 * 1024 * 1024
    keepalive_s: float = 15.0
    health_interval_s: float = 0.5
    health_timeout_s: float = 2.0  # a /health poll slower than this counts as a failure
    # Once the engine has been ready, this many failed polls in a row make it not ready (one
    # slow or failed poll alone does not turn requests away for a whole interval).
    unready_after_failures: int = 2
    upstream_timeout_s: float = 600.0  # wait for the engine's response head
    max_response_bytes: int = 64 * 1024 * 1024  # non-stream bodies are read whole
    # All request bodies being read or held plus all non-stream responses being read, together
    # (503 proxy_buffers_full above): bounds memory whatever the number of connections.
    max_buffered_bytes: int = 256 * 1024 * 1024
    body_timeout_s: float = 60.0  # the whole request body must arrive within this (408)
    # Enforced by the HTTP server (serving/proxy/server.py), not the app: 431 / 408.
    max_head_bytes: int = 32 * 1024
    head_timeout_s: float = 10.0
    connect_retries: int = 3
    retry_after_busy_s: int = 1
    retry_after_not_ready_s: int = 5

    def __post_init__(self) -> None:
        rules = [
            ("max_in_flight", self.max_in_flight >= 1, "at least 1"),
            ("max_body_bytes", self.max_body_bytes >= 1, "at least 1"),
            ("keepalive_s", self.keepalive_s >= 0, ">= 0 (0 turns keep-alives off)"),
            ("health_interval_s", self.health_interval_s > 0, "> 0"),
            ("health_timeout_s", self.health_timeout_s > 0, "> 0"),
            ("unready_after_failures", self.unready_after_failures >= 1, "at least 1"),
            ("upstream_timeout_s", self.upstream_timeout_s > 0, "> 0"),
            ("max_response_bytes", self.max_response_bytes >= 1, "at least 1"),
            (
                "max_buffered_bytes",
                self.max_buffered_bytes >= self.max_body_bytes,
                f">= max_body_bytes ({self.max_body_bytes}): one largest body must fit",
            ),
            ("body_timeout_s", self.body_timeout_s > 0, "> 0"),
            ("max_head_bytes", self.max_head_bytes >= 1024, "at least 1024"),
            ("head_timeout_s", self.head_timeout_s > 0, "> 0"),
            ("connect_retries", self.connect_retries >= 0, ">= 0"),
        ]
        for name, ok, rule in rules:
            if not ok:
                raise ValueError(
                    f"proxy setting {name}={getattr(self, name)!r} is invalid: it must be {rule}"
                )


class _Exchange:
    """Per-request facts gathered for the access log and metrics."""

    __slots__ = (
        "body_unread",
        "client_gone",
        "completion_tokens",
        "conn",
        "error",
        "finished",
        "held",
        "key",
        "method",
        "overhead",
        "path",
        "prompt_tokens",
        "request_id",
        "resp",
        "route",
        "status",
        "stream",
        "t0",
        "ttft",
        "wants_usage",
        "watch",
    )

    def __init__(
        self, t0: float, route: Route, request_id: bytes, method: str, path: bytes
    ) -> None:
        self.t0 = t0
        self.route = route
        self.method = method
        self.path = path
        self.request_id = request_id
        self.key = "-"
        self.status = 0
        self.ttft: float | None = None
        self.overhead = 0.0
        self.prompt_tokens: int | None = None
        self.completion_tokens: int | None = None
        self.error: str | None = None
        self.stream = False
        self.wants_usage = False  # the client set stream_options.include_usage
        self.finished = False
        self.client_gone = False
        self.resp: UpstreamResponse | None = None
        self.watch: _ClientWatch | None = None
        self.body_unread = False  # the client announced a body the proxy has not read
        self.held = 0  # bytes of the proxy's buffer budget this request holds
        # The proxy's own server's request object (serving/proxy/httpserver.py), else None.
        self.conn: Any = None


def _access_emitter() -> Callable[[str], None]:
    """How to write an access line: straight into the batching handler that the CLI installs
    (no LogRecord per request), or through ``logging`` for any other setup (e.g. caplog)."""
    parent = logging.getLogger("serving.proxy")
    if (
        not access_log.handlers
        and not access_log.filters
        and parent.propagate is False
        and len(parent.handlers) == 1
        and isinstance(parent.handlers[0], BatchingStreamHandler)
    ):
        return parent.handlers[0].append_line
    return access_log.info


class _ClientWatch:
    """Aborts the engine request the moment the client disconnects.

    Watching needs a task blocked in ``receive()``. Quick non-stream exchanges (the common
    case) finish before ``WATCH_AFTER_S`` and never pay for one; streams start it at once.
    """

    __slots__ = ("_ex", "_receive", "_task", "_timer")
    WATCH_AFTER_S = 0.02

    def __init__(self, receive: Receive, ex: _Exchange) -> None:
        self._receive = receive
        self._ex = ex
        self._task: asyncio.Task[None] | None = None
        self._timer: asyncio.TimerHandle | None = asyncio.get_running_loop().call_later(
            self.WATCH_AFTER_S, self.start
        )

    def start(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._task is None and not self._ex.finished:
            self._task = asyncio.get_running_loop().create_task(self._watch())

    def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._task is not None and not self._task.done():
            self._task.cancel()

    async def _watch(self) -> None:
        receive = self._receive
        while (await receive())["type"] != "http.disconnect":
            pass
        ex = self._ex
        if not ex.finished:
            ex.client_gone = True
            if ex.resp is not None:
                ex.resp.abort()


def _client_left(ex: _Exchange) -> None:
    """The client's connection is gone: abort the engine request (it stops generating)."""
    if not ex.finished:
        ex.client_gone = True
        if ex.resp is not None:
            ex.resp.abort()


def _error_body(message: str, type_: str, code: str) -> bytes:
    return json.dumps(
        {"error": {"message": message, "type": type_, "param": None, "code": code}}
    ).encode()


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


# One decoder for every request (json.loads with options would build one per call). Bodies
# must be UTF-8 (RFC 8259); NaN/Infinity are not JSON and are refused.
_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


def _loads_stdlib(body: bytes) -> Any:
    return _DECODER.decode(body.decode("utf-8"))


# orjson (Rust, ~2 GB/s on string-heavy bodies vs ~0.1 GB/s for the stdlib here: bench/proxy)
# refuses the same inputs: invalid UTF-8, NaN/Infinity, numbers that overflow to infinity,
# nesting deeper than 1024; it also refuses lone surrogate escapes ("\ud800"), which the
# stdlib accepts and no engine needs. Its errors are ValueErrors. The stdlib is the fallback.
try:
    from orjson import loads as _orjson_loads

    _loads: Callable[[bytes], Any] = _orjson_loads
except ImportError:  # pragma: no cover - orjson is pinned in pyproject.toml
    _loads = _loads_stdlib

# simdjson (pysimdjson) validates a whole document without building Python objects: ~1-2 GB/s
# on a long chat history of many small messages, where orjson, which builds every dict and
# string, manages ~0.3-0.6 (bench/proxy, issue 13). It is used for bodies of at least
# _SIMDJSON_FROM bytes (below that its per-call cost, ~9 us, is more than orjson's parse), and
# only to say yes: when it refuses a body, orjson's verdict is taken instead, so a body is
# refused only if orjson refuses it too (simdjson alone refuses integers beyond 64 bits and
# objects nested exactly 1024 deep, which orjson accepts; nothing was found the other way:
# tests/serving/test_proxy_input.py sends each case padded past the threshold).
_SIMDJSON_FROM = 16 * 1024
try:
    import simdjson as _simdjson

    _SIMD_PARSER: Any = _simdjson.Parser()
    _SIMD_OBJECT: Any = _simdjson.Object
except ImportError:  # pragma: no cover - pysimdjson is pinned in pyproject.toml
    _SIMD_PARSER = None


# Objects with more top-level keys than this go to orjson: an OpenAI request has about 30
# parameters, and listing the keys of a very wide object costs more than orjson's parse.
_SIMD_MAX_KEYS = 64


def _check_simd(doc: Any) -> tuple[str | None, bool, bool] | None:
    """``check_body``'s verdict from a simdjson document; None: let orjson decide (a wide
    object, or `stream`/`stream_options`/`include_usage` given twice: simdjson would read the
    first, orjson and the engines' Python parsers the last)."""
    if not isinstance(doc, _SIMD_OBJECT):
        kind = "list" if isinstance(doc, _simdjson.Array) else type(doc).__name__
        return f"request body must be a JSON object, got a JSON {kind}", False, False
    if len(doc) > _SIMD_MAX_KEYS:
        return None
    # Looked up only when present: `get` of a missing key costs a C++ exception inside
    # pysimdjson (~3 us each, measured).
    keys = list(doc.keys())
    if keys.count("stream") > 1 or keys.count("stream_options") > 1:
        return None
    stream = doc["stream"] if "stream" in keys else False
    usage = False
    if "stream_options" in keys:
        options = doc["stream_options"]
        if isinstance(options, _SIMD_OBJECT):
            if len(options) > _SIMD_MAX_KEYS:
                return None
            option_keys = list(options.keys())
            if option_keys.count("include_usage") > 1:
                return None
            usage = "include_usage" in option_keys and options["include_usage"] is True
    if not isinstance(stream, bool):
        return "'stream' must be true or false", False, False
    return None, stream, usage


def check_body(body: bytes) -> tuple[str | None, bool, bool]:
    """The request-body check: ``(problem, stream, include_usage)``; ``problem`` is None for
    a JSON object whose ``stream`` (if present) is a boolean, else what is wrong (a 400)."""
    if _SIMD_PARSER is not None and len(body) >= _SIMDJSON_FROM:
        doc: Any = None
        with contextlib.suppress(Exception):  # any refusal: orjson decides below
            doc = _SIMD_PARSER.parse(body)
        if doc is not None:
            try:
                verdict = _check_simd(doc)
            finally:
                # The parser is reusable only once no proxy object of its document is left
                # (_check_simd's locals are gone with its frame).
                del doc
            if verdict is not None:
                return verdict
    try:
        data = _loads(body)
    except (ValueError, RecursionError) as exc:
        return f"request body is not valid JSON ({exc.__class__.__name__})", False, False
    if not isinstance(data, dict):
        return f"request body must be a JSON object, got a JSON {type(data).__name__}", False, False
    stream = data.get("stream", False)
    if not isinstance(stream, bool):
        return "'stream' must be true or false", False, False
    options = data.get("stream_options")
    return None, stream, isinstance(options, dict) and options.get("include_usage") is True


class _Relay:
    """What a stream's relay keeps between engine reads: where the client is in the SSE event
    stream, the usage seen, the filter. ``process`` is the per-read work; ``sink`` does it and
    writes to the client straight from the engine connection's callback (own server)."""

    __slots__ = (
        "at_boundary", "error", "ex", "must_drain", "resp", "scan", "strip", "tail",
        "usage_last", "usage_prev", "write_piece",
    )  # fmt: skip

    def __init__(self, ex: _Exchange, scan: bool, strip: UsageChunkFilter | None) -> None:
        self.ex = ex
        self.scan = scan
        self.strip = strip
        self.tail = b""
        self.at_boundary = True  # the last byte relayed ended an SSE event
        # Token counts are read from the last two reads that carried any (a usage object may
        # straddle two reads; vLLM repeats running totals on every chunk, so scanning each
        # read would be wasted work): at the end, however the stream ends.
        self.usage_prev: bytes | None = None
        self.usage_last: bytes | None = None
        self.write_piece: Callable[[bytes], bool] | None = None
        self.resp: UpstreamResponse | None = None
        self.must_drain = False
        self.error: BaseException | None = None

    def process(self, data: bytes) -> bytes:
        """One engine read in, what to send the client out (b"": nothing yet)."""
        ex = self.ex
        if ex.ttft is None:
            ex.ttft = time.perf_counter() - ex.t0
        if self.scan:
            window = self.tail + data
            if b'_tokens"' in window:
                self.usage_prev, self.usage_last = self.usage_last, window
            self.tail = window[-192:]
        strip = self.strip
        if strip is not None:
            data = strip.feed(data)
            if not data:
                return b""  # held back: part of an event, or a dropped usage chunk
        self.at_boundary = data.endswith(EVENT_ENDS)
        return data

    def sink(self, data: bytes) -> None:
        try:
            data = self.process(data)
            if data and self.write_piece is not None and self.write_piece(data):
                # The client's socket is full: stop reading the engine until it drains.
                resp = self.resp
                if resp is not None:
                    resp.pause_reading()
                    self.must_drain = True
                    resp.poke()
        except Exception as exc:  # surfaced by the relay task as proxy_internal_error
            self.error = exc
            raise


class ProxyApp:
    """The ASGI application. One instance per process; state is the counters and the pool."""

    def __init__(self, config: ProxyConfig, keys: KeyRing) -> None:
        self.config = config
        self.buffered_bytes = 0  # request + non-stream response bodies held (max_buffered_bytes)
        self.keys = keys
        self.metrics = Metrics()
        self.client = UpstreamClient(config.upstream, connect_retries=config.connect_retries)
        self.ready = False
        self._ready_reason = "engine health not checked yet"
        self._failed_polls = 0  # consecutive failed /health polls
        self._poller: asyncio.Task[None] | None = None
        self._stopping = False
        self._emit_access: Callable[[str], None] = _access_emitter()
        # Request ids: a random per-process prefix + a counter (no syscall per request).
        self._id_prefix = os.urandom(8).hex().encode()
        self._id_counter = itertools.count(1)
        self._busy_headers = [(b"retry-after", str(config.retry_after_busy_s).encode())]
        self._not_ready_headers = [(b"retry-after", str(config.retry_after_not_ready_s).encode())]

    # -- lifecycle -------------------------------------------------------------------------
    async def startup(self) -> None:
        self._stopping = False
        self._emit_access = _access_emitter()
        self._poller = asyncio.get_running_loop().create_task(self._poll_health())

    async def shutdown(self) -> None:
        self._stopping = True
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
            self._poller = None
        self.client.close()
        # uvicorn re-raises SIGTERM after shutdown, so atexit never runs: flush logs now.
        for logger in (access_log, event_log):
            for handler in logger.handlers:
                handler.flush()

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await self.startup()
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    def _set_ready(self, ready: bool, reason: str) -> None:
        if ready != self.ready:
            event_log.warning(
                json.dumps({"event": "engine_ready" if ready else "engine_not_ready",
                            "reason": reason, "upstream": self.config.upstream})
            )  # fmt: skip
        self.ready = ready
        self.metrics.engine_ready = ready
        self._ready_reason = reason

    async def _poll_health(self) -> None:
        interval = self.config.health_interval_s
        timeout = self.config.health_timeout_s
        while not self._stopping:
            try:
                # asyncio.timeout, not wait_for: Python 3.11's wait_for swallows a cancel that
                # arrives as the poll completes (gh-86296), and the poller then never ended,
                # so shutdown waited for it forever.
                async with asyncio.timeout(timeout):
                    ready, reason = await self._check_health()
            except TimeoutError:
                ready, reason = False, f"engine /health did not answer within {timeout:g} s"
            except Exception as exc:  # never let the poller die: readiness would freeze
                event_log.exception("engine health check failed unexpectedly")
                ready, reason = False, f"health check error: {exc.__class__.__name__}"
            self._poll_result(ready, reason)
            self.client.prune()
            await asyncio.sleep(interval)

    def _poll_result(self, ready: bool, reason: str) -> None:
        """Hysteresis: ready at the first good poll; not ready again only after
        ``unready_after_failures`` failed polls in a row (at once if it never was ready)."""
        if ready:
            self._failed_polls = 0
            self._set_ready(True, reason)
            return
        self._failed_polls += 1
        self.metrics.health_failures += 1
        if not self.ready or self._failed_polls >= self.config.unready_after_failures:
            self._set_ready(False, reason)
        else:
            event_log.warning(
                json.dumps({"event": "engine_health_failed", "reason": reason,
                            "failed_in_a_row": self._failed_polls,
                            "unready_after": self.config.unready_after_failures})
            )  # fmt: skip

    async def _check_health(self) -> tuple[bool, str]:
        resp: UpstreamResponse | None = None
        try:
            resp = await self.client.request(b"GET", b"/health", [], retry_connect=False)
            await resp.head()
            await resp.read_all(1 << 16)
        except UpstreamError as exc:
            return False, str(exc)
        finally:
            # Cancelled by the poller's timeout: close the connection (an engine that never
            # answers would otherwise collect one open connection per poll).
            if resp is not None and not resp.finished:
                resp.abort()
        if resp.status == 200:
            return True, "engine /health answered 200"
        return False, f"engine /health answered {resp.status}"

    # -- ASGI entry ------------------------------------------------------------------------
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        t0 = time.perf_counter()
        kind = scope["type"]
        if kind != "http":
            if kind == "lifespan":
                await self._lifespan(receive, send)
            return  # websockets are not served (uvicorn runs with ws="none")
        raw_path = scope.get("raw_path") or scope["path"].encode("latin-1")
        route = ROUTES.get(raw_path, _UNMATCHED)
        auth: bytes | None = None
        auth_count = 0
        request_id: bytes | None = None
        content_length: bytes | None = None
        chunked = False
        connection: bytes | None = None
        forward: list[tuple[bytes, bytes]] = []
        for name, value in scope["headers"]:
            if name == b"authorization":
                auth = value
                auth_count += 1
            elif name == b"x-request-id":
                request_id = value
            elif name == b"content-length":
                content_length = value
            elif name == b"transfer-encoding":
                chunked = True
            elif name == b"connection":
                connection = value if connection is None else connection + b"," + value
            elif name in _FORWARD_HEADERS:
                forward.append((name, value))
        if connection is not None and forward:
            # Headers the client names in Connection are hop-by-hop (RFC 9110 7.6.1).
            hop = {token.strip().lower() for token in connection.split(b",")}
            forward = [(name, value) for name, value in forward if name not in hop]
        if request_id is None or not _REQUEST_ID_RE.fullmatch(request_id):
            request_id = b"%s%08x" % (self._id_prefix, next(self._id_counter))
        ex = _Exchange(t0, route, request_id, scope["method"], raw_path)
        extensions = scope.get("extensions")
        if extensions:
            ex.conn = extensions.get("serving.proxy.request")
        if chunked or (content_length is not None and content_length != b"0"):
            ex.body_unread = True
        try:
            if route.kind < 0:
                await self._error(
                    send, ex, 404, "no such route", "not_found_error", "route_not_found"
                )
            elif scope["method"] != route.method:
                await self._error(
                    send, ex, 405, f"method not allowed; use {route.method}",
                    "invalid_request_error", "method_not_allowed",
                    [(b"allow", route.method.encode())],
                )  # fmt: skip
            elif route.kind == _HEALTH:
                await self._plain(send, ex, 200, b'{"status":"ok"}')
            elif route.kind == _READY:
                if self.ready:
                    await self._plain(send, ex, 200, b'{"ready":true}')
                else:
                    await self._error(
                        send, ex, 503, f"engine not ready: {self._ready_reason}",
                        "service_unavailable", "engine_not_ready", self._not_ready_headers,
                    )  # fmt: skip
            elif await self._authenticate(send, ex, auth, auth_count):
                if route.kind == _METRICS:
                    await self._plain(
                        send, ex, 200, self.metrics.render(),
                        (b"content-type", b"text/plain; version=0.0.4; charset=utf-8"),
                    )  # fmt: skip
                else:
                    await self._admit(receive, send, ex, content_length, forward)
        except Exception as exc:  # a bug of ours: uvicorn answers 500 (or drops the stream)
            ex.status = ex.status or 500  # set only once a response head was handed over
            ex.error = f"proxy_internal_error: {exc.__class__.__name__}"
            event_log.exception("proxy internal error")
            raise
        finally:
            self._account(ex)

    # -- steps -----------------------------------------------------------------------------
    async def _authenticate(
        self, send: Send, ex: _Exchange, auth: bytes | None, count: int
    ) -> bool:
        key = parse_bearer(auth) if count == 1 else None
        if key is None:
            why = "missing" if count == 0 else "malformed (expected one 'Bearer <key>')"
            await self._error(
                send, ex, 401, f"Authorization header {why}", "authentication_error",
                "missing_api_key" if count == 0 else "malformed_authorization",
                [(b"www-authenticate", b"Bearer")],
            )  # fmt: skip
            return False
        name = self.keys.match(key)
        if name is None:
            await self._error(
                send, ex, 403, "API key not recognised", "permission_error", "invalid_api_key"
            )
            return False
        ex.key = name
        return True

    async def _admit(
        self,
        receive: Receive,
        send: Send,
        ex: _Exchange,
        content_length: bytes | None,
        forward: list[tuple[bytes, bytes]],
    ) -> None:
        if not self.ready:
            await self._error(
                send, ex, 503, f"engine not ready: {self._ready_reason}",
                "service_unavailable", "engine_not_ready", self._not_ready_headers,
            )  # fmt: skip
            return
        body = b""
        try:
            if ex.route.method == "POST":
                # The body is read before the in-flight slot is taken: a slow body holds only
                # its share of the buffer budget (and at most body_timeout_s), never a slot.
                got = await self._read_body(receive, send, ex, content_length)
                if got is None:
                    return
                if not await self._validate(send, ex, got):
                    return
                body = got
                forward.append(_JSON)  # validated JSON, whatever the client labelled it
            metrics = self.metrics
            if metrics.in_flight >= self.config.max_in_flight:
                await self._error(
                    send, ex, 429, f"proxy at capacity ({self.config.max_in_flight} requests "
                    "in flight); retry after the Retry-After delay", "rate_limit_error",
                    "proxy_at_capacity", self._busy_headers,
                )  # fmt: skip
                return
            metrics.in_flight += 1
            try:
                await self._forward(receive, send, ex, body, forward)
            finally:
                metrics.in_flight -= 1
        finally:
            self.buffered_bytes -= ex.held  # the request body, and a response read whole
            ex.held = 0

    async def _read_body(
        self, receive: Receive, send: Send, ex: _Exchange, content_length: bytes | None
    ) -> bytes | None:
        limit = self.config.max_body_bytes
        if content_length is not None:
            if not content_length.isdigit():
                await self._error(
                    send, ex, 400, "malformed Content-Length", "invalid_request_error",
                    "invalid_content_length",
                )  # fmt: skip
                return None
            announced = int(content_length)
            if announced > limit:
                await self._body_too_large(send, ex)
                return None
            if not self._hold(ex, announced):  # reserved before a byte is read
                await self._buffers_full(send, ex)
                return None
        conn = ex.conn
        if conn is not None and not conn.more_body:
            # Our server has the whole body already (the usual case): no wait, no timer.
            message = await receive()
            if message["type"] == "http.request":
                body: bytes = message.get("body", b"")
                if len(body) > limit:
                    await self._body_too_large(send, ex)
                    return None
                if content_length is None and not self._hold(ex, len(body)):
                    await self._buffers_full(send, ex)
                    return None
                ex.body_unread = False
                return body
            ex.client_gone = True
            return None
        # The whole body must have arrived by t0 + body_timeout_s.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.body_timeout_s - (time.perf_counter() - ex.t0)
        try:
            async with asyncio.timeout_at(deadline):
                return await self._read_body_rest(send, ex, receive, content_length)
        except TimeoutError:
            await self._error(
                send, ex, 408, f"request body not received within {self.config.body_timeout_s:g}"
                " s", "invalid_request_error", "request_timeout",
            )  # fmt: skip
            return None

    async def _read_body_rest(
        self,
        send: Send,
        ex: _Exchange,
        receive: Receive,
        content_length: bytes | None,
    ) -> bytes | None:
        limit = self.config.max_body_bytes
        parts: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                ex.client_gone = True
                return None
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                await self._body_too_large(send, ex)
                return None
            if content_length is None and not self._hold(ex, len(chunk)):  # chunked upload
                await self._buffers_full(send, ex)
                return None
            parts.append(chunk)
            if not message.get("more_body", False):
                ex.body_unread = False
                return parts[0] if len(parts) == 1 else b"".join(parts)

    def _hold(self, ex: _Exchange, size: int) -> bool:
        """Take ``size`` bytes of the global buffer budget for ``ex`` (False: not available).
        ``_admit`` gives back what the request held when it ends."""
        if self.buffered_bytes + size > self.config.max_buffered_bytes:
            return False
        self.buffered_bytes += size
        ex.held += size
        return True

    async def _buffers_full(self, send: Send, ex: _Exchange) -> None:
        await self._error(
            send, ex, 503, f"proxy buffers full ({self.config.max_buffered_bytes} bytes of "
            "request and response bodies held); retry after the Retry-After delay",
            "service_unavailable", "proxy_buffers_full", self._busy_headers,
        )  # fmt: skip

    async def _body_too_large(self, send: Send, ex: _Exchange) -> None:
        await self._error(
            send, ex, 413, f"request body larger than {self.config.max_body_bytes} bytes",
            "invalid_request_error", "request_too_large",
        )  # fmt: skip

    async def _validate(self, send: Send, ex: _Exchange, body: bytes) -> bool:
        problem, ex.stream, ex.wants_usage = check_body(body)
        if problem is None:
            return True
        await self._error(send, ex, 400, problem, "invalid_request_error", "invalid_json")
        return False

    async def _forward(
        self,
        receive: Receive,
        send: Send,
        ex: _Exchange,
        body: bytes,
        forward: list[tuple[bytes, bytes]],
    ) -> None:
        route = ex.route
        forward.append((b"x-request-id", ex.request_id))
        conn = ex.conn
        watch: _ClientWatch | None = None
        if conn is not None:  # our server calls back when the client leaves: no watcher task
            if conn.disconnected:
                ex.client_gone = True
            else:
                conn.on_disconnect = functools.partial(_client_left, ex)
        else:
            watch = ex.watch = _ClientWatch(receive, ex)
        try:
            await self._exchange(send, ex, route, forward, body)
        finally:
            ex.finished = True
            if watch is not None:
                watch.stop()
            elif conn is not None:
                conn.on_disconnect = None
            resp = ex.resp
            if resp is not None and not resp.finished:
                # Only on an exception or cancellation (every normal path ends the response):
                # close the engine connection so the engine stops generating for nobody.
                resp.abort()

    async def _exchange(
        self,
        send: Send,
        ex: _Exchange,
        route: Route,
        headers: list[tuple[bytes, bytes]],
        body: bytes,
    ) -> None:
        client = self.client
        retries_before = client.retries
        try:
            resp = await client.request(
                route.method.encode(), route.path, headers, body,
                head_timeout_s=self.config.upstream_timeout_s,
            )  # fmt: skip
        except ConnectFailed as exc:
            self.metrics.connect_retries += client.retries - retries_before
            self.metrics.upstream_errors["connect"] += 1
            self._set_ready(False, str(exc))
            await self._error(
                send, ex, 503, f"engine unreachable: {exc}", "service_unavailable",
                "engine_unreachable", self._not_ready_headers,
            )  # fmt: skip
            return
        self.metrics.connect_retries += client.retries - retries_before
        ex.resp = resp
        if ex.held:  # the request body is written out: its share of the budget is free again
            self.buffered_bytes -= ex.held
            ex.held = 0
        t_sent = time.perf_counter()
        if ex.client_gone:
            resp.abort()
        try:
            await resp.head()
            t_head = time.perf_counter()
            if resp.content_type.startswith(b"text/event-stream"):
                await self._relay_stream(send, ex, resp, t_sent, t_head)
                return
            data = await self._read_response(resp, ex)
        except UpstreamError as exc:
            if ex.client_gone:
                ex.status = 499
                return
            timeout = isinstance(exc, UpstreamTimeout)
            self.metrics.upstream_errors["timeout" if timeout else "broken"] += 1
            await self._error(
                send, ex, 504 if timeout else 502, f"engine request failed: {exc}",
                "upstream_error", "engine_timeout" if timeout else "engine_failed",
            )  # fmt: skip
            return
        if data is None:
            await self._buffers_full(send, ex)
            return
        t_done = time.perf_counter()
        drop = (
            _DROP_RESPONSE_HEADERS | resp.hop_headers
            if resp.hop_headers
            else _DROP_RESPONSE_HEADERS
        )
        out = [(name, value) for name, value in resp.headers if name not in drop]
        out.append((b"content-length", str(len(data)).encode()))
        ex.finished = True
        now = time.perf_counter()
        ex.overhead = (t_sent - ex.t0) + (now - t_done)
        out.append((b"x-request-id", ex.request_id))
        out.append((b"x-proxy-overhead-ms", f"{ex.overhead * 1000:.3f}".encode()))
        await send({"type": "http.response.start", "status": resp.status, "headers": out})
        ex.status = resp.status
        await send({"type": "http.response.body", "body": data, "more_body": False})
        if route.usage and resp.status == 200 and b'_tokens"' in data:  # after the response
            self._scan_usage(data, ex)

    async def _read_response(self, resp: UpstreamResponse, ex: _Exchange) -> bytes | None:
        """A non-stream body, read whole within ``max_response_bytes`` and the global buffer
        budget (None, engine connection closed: the budget is used up)."""
        limit = self.config.max_response_bytes
        parts: list[bytes] = []
        size = 0
        while True:
            data = await resp.read()
            if data is None:
                continue
            if not data:
                return parts[0] if len(parts) == 1 else b"".join(parts)
            size += len(data)
            if size > limit:
                resp.abort()
                raise UpstreamBroken(f"engine response body exceeds {limit} bytes")
            if not self._hold(ex, len(data)):
                resp.abort()
                return None
            parts.append(data)

    async def _relay_stream(
        self,
        send: Send,
        ex: _Exchange,
        resp: UpstreamResponse,
        t_sent: float,
        t_head: float,
    ) -> None:
        ex.stream = True
        drop = (
            _DROP_RESPONSE_HEADERS | resp.hop_headers
            if resp.hop_headers
            else _DROP_RESPONSE_HEADERS
        )
        out = [(name, value) for name, value in resp.headers if name not in drop]
        out += _STREAM_HEADERS
        out.append((b"x-request-id", ex.request_id))
        ex.overhead = (t_sent - ex.t0) + (time.perf_counter() - t_head)
        out.append((b"x-proxy-overhead-ms", f"{ex.overhead * 1000:.3f}".encode()))
        if ex.watch is not None:
            ex.watch.start()  # streams last: watch for the client leaving from now on
        await send({"type": "http.response.start", "status": resp.status, "headers": out})
        ex.status = resp.status
        keepalive_s = self.config.keepalive_s
        idle_limit = self.config.upstream_timeout_s
        # Ticks every keepalive_s for the comments; with comments off (0) still one per
        # idle_limit, so the stream silence limit holds either way.
        resp.keepalive_ticks(keepalive_s or idle_limit)
        scan = ex.route.usage and resp.status == 200
        # Usage chunks the engine sends unasked are counted (scan), then dropped: see sse.py.
        relay = _Relay(ex, scan, UsageChunkFilter() if scan and not ex.wants_usage else None)
        conn = ex.conn
        if conn is not None:
            # Our server: every engine read is relayed from the engine connection's own
            # callback (no task switch, no message dict per event); this task only handles
            # the end, failures, keep-alive ticks and a full client socket.
            relay.write_piece = conn.write_piece
            relay.resp = resp
            resp.set_sink(relay.sink)
        try:
            while True:
                try:
                    data = await resp.read()
                except UpstreamBroken as exc:
                    if relay.error is not None:
                        raise relay.error from None  # a bug in the relay: proxy_internal_error
                    if ex.client_gone:
                        ex.status = 499
                        return
                    # What the filter holds back (half an event) is never sent.
                    await self._end_stream_with_error(send, ex, str(exc), relay.at_boundary)
                    return
                if data is None:  # a keep-alive tick, or the relay waits for the client
                    if relay.must_drain:
                        relay.must_drain = False
                        await conn.drain()
                        resp.resume_reading()
                        continue
                    if resp.idle_s() >= idle_limit - 1e-3:
                        resp.abort()
                        await self._end_stream_with_error(
                            send, ex, f"engine sent nothing for {idle_limit:g} s",
                            relay.at_boundary,
                        )  # fmt: skip
                        return
                    # never inside an event the engine has half sent
                    if relay.at_boundary and keepalive_s:
                        await send(
                            {"type": "http.response.body", "body": KEEPALIVE_COMMENT,
                             "more_body": True}
                        )  # fmt: skip
                    continue
                if not data:
                    break
                data = relay.process(data)  # only without a sink (uvicorn)
                if data:
                    await send({"type": "http.response.body", "body": data, "more_body": True})
            ex.finished = True
            rest = b"" if relay.strip is None else relay.strip.flush()
            await send({"type": "http.response.body", "body": rest, "more_body": False})
        finally:
            resp.set_sink(None)
            for seen in (relay.usage_prev, relay.usage_last):
                if seen is not None:
                    self._scan_usage(seen, ex)

    async def _end_stream_with_error(
        self, send: Send, ex: _Exchange, why: str, at_boundary: bool
    ) -> None:
        """The 200 head is gone already: end with an SSE error event and ``[DONE]`` so the
        client sees a failure, never a silently truncated stream."""
        self.metrics.upstream_errors["mid_stream"] += 1
        ex.error = "engine_stream_failed"
        event = _error_body(
            f"the engine stream failed before it finished: {why}", "upstream_error",
            "engine_stream_failed",
        )  # fmt: skip
        body = b"data: " + event + b"\n\ndata: [DONE]\n\n"
        if not at_boundary:
            body = b"\n\n" + body  # close the engine's half-sent event first
        ex.finished = True
        await send({"type": "http.response.body", "body": body, "more_body": False})

    # -- helpers ---------------------------------------------------------------------------
    @staticmethod
    def _scan_usage(data: bytes, ex: _Exchange) -> None:
        for match in _USAGE_RE.finditer(data):
            start = match.start()
            if start and data[start - 1] == 0x5C:  # \" : a quote inside a string, not a key
                continue
            name, value = match.groups()
            if name == b"prompt_tokens":
                ex.prompt_tokens = int(value)
            else:
                ex.completion_tokens = int(value)

    async def _plain(
        self,
        send: Send,
        ex: _Exchange,
        status: int,
        body: bytes,
        content_type: tuple[bytes, bytes] = _JSON,
        extra: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        ex.overhead = time.perf_counter() - ex.t0
        headers = [
            content_type,
            (b"content-length", str(len(body)).encode()),
            (b"x-request-id", ex.request_id),
            (b"x-proxy-overhead-ms", f"{ex.overhead * 1000:.3f}".encode()),
        ]
        if extra:
            headers += extra
        if ex.body_unread:
            # Answered without reading the body the client announced (401, 404, 413, 429, or
            # a GET /health with a body): close the connection rather than let uvicorn read and
            # discard it, whatever its size.
            headers.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        ex.status = status
        await send({"type": "http.response.body", "body": body, "more_body": False})

    async def _error(
        self,
        send: Send,
        ex: _Exchange,
        status: int,
        message: str,
        type_: str,
        code: str,
        extra: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        ex.error = code
        await self._plain(send, ex, status, _error_body(message, type_, code), _JSON, extra)

    @staticmethod
    def _logged_path(ex: _Exchange) -> str:
        logged = _LOGGED_PATH.get(ex.route.name)
        if logged is not None:
            return logged
        return f'"path":null,"path_sha256":"{path_fingerprint(ex.path)}","path_len":{len(ex.path)}'

    def _account(self, ex: _Exchange) -> None:
        duration = time.perf_counter() - ex.t0
        status = ex.status or 499  # nothing sent: the client went away first
        if status == 499:
            ex.status = 499
        route = ex.route.name
        metrics = self.metrics
        metrics.requests[(route, str(status), ex.key)] += 1
        metrics.latency.observe((route,), duration)
        metrics.overhead.observe((route,), ex.overhead)
        if ex.ttft is not None:
            metrics.ttft.observe((route,), ex.ttft)
        if ex.prompt_tokens is not None:
            metrics.tokens[(ex.key, "prompt")] += ex.prompt_tokens
        if ex.completion_tokens is not None:
            metrics.tokens[(ex.key, "completion")] += ex.completion_tokens
        if access_log.isEnabledFor(logging.INFO):
            # Built by hand (every value but the path is from a closed, JSON-safe set): this is
            # several times cheaper than json.dumps of a dict on the hot path.
            self._emit_access(
                f'{{"ts":{time.time():.3f},"request_id":"{ex.request_id.decode()}",'
                f'"method":{_json_str(ex.method)},{self._logged_path(ex)},'
                f'"route":"{route}","status":{status},"key":"{ex.key}",'
                f'"stream":{"true" if ex.stream else "false"},"duration_ms":{duration * 1000:.3f},'
                f'"ttft_ms":{"null" if ex.ttft is None else f"{ex.ttft * 1000:.3f}"},'
                f'"overhead_ms":{ex.overhead * 1000:.3f},'
                f'"prompt_tokens":{"null" if ex.prompt_tokens is None else ex.prompt_tokens},'
                f'"completion_tokens":'
                f"{'null' if ex.completion_tokens is None else ex.completion_tokens},"
                f'"error":{"null" if ex.error is None else _json_str(ex.error)}}}'
            )
