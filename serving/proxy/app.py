"""The proxy itself: authenticates, admits and forwards each request to the engine.

Request path, in order (each step answers without touching the engine when it says no):
1. route: the raw path bytes must equal one of ``ROUTES`` exactly (404 otherwise, 405 for a
   known path with the wrong method); no decoding or normalising, so ``//v1/...``,
   ``/v1/../metrics``, ``%2e`` or ``/V1/...`` never match;
2. key: ``Authorization: Bearer <key>`` (401 missing/malformed, 403 unknown);
3. readiness (503 + Retry-After);
4. body: size (413), the buffer budget charged as the bytes arrive, the key's share of it
   and the whole of it (503), and the JSON object check (400; a GET route takes no body);
5. the in-flight cap, shared fairly between keys (serving/proxy/admission.py: a key below
   its fair share waits briefly for a slot, one at or above it gets 429 + Retry-After; a key
   may have a limit of its own), taken only once the body is in, so a slow body never holds
   a slot;
6. send over the pooled client; the answer is relayed by ``relay.Relay`` (streams piece by
   piece with keep-alive comments, other bodies read whole).

The steps run in ``__call__``, the ASGI entry (served by uvicorn: serving/proxy/runner.py);
the engine's answer is relayed from the engine connection's callbacks (relay.py) and sent
through ``_AsgiWriter``.

The access log never holds an unmatched path's text (a client may have put its key in it):
only ``path_fingerprint`` and the length.

See docs/proxy.md for the behaviour contract and the measured overhead.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import hashlib
import itertools
import logging
import mmap
import os
import re
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, MutableMapping
from dataclasses import dataclass, field
from json.encoder import encode_basestring_ascii as _json_str  # quoted, escaped, ASCII
from typing import TYPE_CHECKING, Any, ClassVar

import orjson
import simdjson

from serving.proxy.admission import ADMITTED, KEY_LIMIT, QUEUED, Admission
from serving.proxy.exchange import Exchange, Route
from serving.proxy.keys import KeyRing, parse_bearer
from serving.proxy.logs import BatchingStreamHandler, event_log, log_event
from serving.proxy.metrics import Metrics
from serving.proxy.relay import ClientWriter, Relay, error_body, scan_usage
from serving.proxy.upstream import (
    ConnectFailed,
    UpstreamClient,
    UpstreamError,
    UpstreamResponse,
)

if TYPE_CHECKING:  # workers.py builds on this module: a name for the checker only
    from serving.proxy.workers import WorkerShare


Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

access_log = logging.getLogger("serving.proxy.access")

_ENGINE, _HEALTH, _READY, _METRICS = range(4)


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
# What ``_begin`` does with each request header it looks at (the rest it skips).
_AUTHORIZATION, _FORWARD, _CONTENT_LENGTH, _REQUEST_ID, _TRANSFER_ENCODING, _CONNECTION = range(6)
_HEADER_KINDS = {
    b"authorization": _AUTHORIZATION,
    b"content-length": _CONTENT_LENGTH,
    b"x-request-id": _REQUEST_ID,
    b"transfer-encoding": _TRANSFER_ENCODING,
    b"connection": _CONNECTION,
    **{name: _FORWARD for name in _FORWARD_HEADERS},
}
_REQUEST_ID_RE = re.compile(rb"[A-Za-z0-9._:-]{1,128}")
# Bodies announced at this size or more are collected in one anonymous mapping as they arrive
# (``_read_body``): contiguous when complete (no join copy), and the memory goes back to the
# system when the body is dropped. Below it a body fits in a read or two anyway.
_COLLECT_FROM = 256 * 1024
_JSON = (b"content-type", b"application/json")

# Each error the proxy answers itself, by its code: the status and the OpenAI error type, and
# whether a Retry-After goes with it (_BUSY: retry_after_busy_s, _NOT_READY: ..._not_ready_s).
_BUSY, _NOT_READY = "busy", "not_ready"
ERRORS: dict[str, tuple[int, str, str | None]] = {
    "invalid_content_length": (400, "invalid_request_error", None),
    "invalid_json": (400, "invalid_request_error", None),
    "unexpected_body": (400, "invalid_request_error", None),
    "missing_api_key": (401, "authentication_error", None),
    "malformed_authorization": (401, "authentication_error", None),
    "invalid_api_key": (403, "permission_error", None),
    "route_not_found": (404, "not_found_error", None),
    "method_not_allowed": (405, "invalid_request_error", None),
    "request_timeout": (408, "invalid_request_error", None),
    "request_too_large": (413, "invalid_request_error", None),
    "key_at_limit": (429, "rate_limit_error", _BUSY),
    "proxy_at_capacity": (429, "rate_limit_error", _BUSY),
    "engine_failed": (502, "upstream_error", None),
    "engine_unreachable": (503, "service_unavailable", _NOT_READY),
    "engine_not_ready": (503, "service_unavailable", _NOT_READY),
    "proxy_buffers_full": (503, "service_unavailable", _BUSY),
    "engine_timeout": (504, "upstream_error", None),
}


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
    # The engine's response head (streams; and a stream's longest silence) or its whole
    # non-stream answer must have arrived this long after the request was sent (504).
    upstream_timeout_s: float = 600.0
    # Idle engine connections are kept this long for reuse; the engine's own keep-alive must
    # be longer (vLLM: VLLM_HTTP_TIMEOUT_KEEP_ALIVE, SGLang: SGLANG_TIMEOUT_KEEP_ALIVE), or a
    # request can be written onto a connection the engine is closing.
    upstream_idle_s: float = 60.0
    # New engine connections being made at once, at most (a burst ramps up).
    upstream_max_connecting: int = 32
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
    # Fair share of max_in_flight between keys (serving/proxy/admission.py): a request of a
    # key below its share waits this long at most for a slot when the pool is full (429 after).
    fair_wait_s: float = 5.0
    # A key's own limit on its requests in flight (key name -> N <= max_in_flight); keys not
    # named may use the whole pool. From the spec's proxy.key_max_in_flight.
    key_max_in_flight: Mapping[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        rules = [
            ("max_in_flight", self.max_in_flight >= 1, "at least 1"),
            ("max_body_bytes", self.max_body_bytes >= 1, "at least 1"),
            ("keepalive_s", self.keepalive_s >= 0, ">= 0 (0 turns keep-alives off)"),
            ("health_interval_s", self.health_interval_s > 0, "> 0"),
            ("health_timeout_s", self.health_timeout_s > 0, "> 0"),
            ("unready_after_failures", self.unready_after_failures >= 1, "at least 1"),
            ("upstream_timeout_s", self.upstream_timeout_s > 0, "> 0"),
            ("upstream_idle_s", self.upstream_idle_s > 0, "> 0"),
            ("upstream_max_connecting", self.upstream_max_connecting >= 1, "at least 1"),
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
            ("fair_wait_s", self.fair_wait_s >= 0, ">= 0 (0: a full pool answers 429 at once)"),
        ]
        for name, ok, rule in rules:
            if not ok:
                raise ValueError(
                    f"proxy setting {name}={getattr(self, name)!r} is invalid: it must be {rule}"
                )
        for key, limit in self.key_max_in_flight.items():
            if not (isinstance(limit, int) and 1 <= limit <= self.max_in_flight):
                raise ValueError(
                    f"proxy setting key_max_in_flight[{key!r}]={limit!r} is invalid: it must "
                    f"be at least 1 and not above max_in_flight ({self.max_in_flight})"
                )


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


@dataclass(slots=True, eq=False, repr=False)
class _AsgiWriter:
    """``relay.ClientWriter`` over an ASGI ``send`` (uvicorn's): what the proxy writes is
    queued as ASGI messages, and the request's coroutine sends them in order (``pump``). More
    than ``HIGH_WATER`` bytes queued: ``write_piece`` says stop, and ``when_drained`` calls
    back once ``send`` has taken them all.

    The client leaving is seen by a task blocked in ``receive()``. Quick non-stream exchanges
    (the common case) finish before ``WATCH_AFTER_S`` and never pay for one; streams start it
    at once."""

    HIGH_WATER: ClassVar[int] = 64 * 1024
    WATCH_AFTER_S: ClassVar[float] = 0.02

    _send: Send
    _receive: Receive
    _queue: collections.deque[Message] = field(default_factory=collections.deque)
    _queued: int = 0
    _wake: asyncio.Future[None] | None = None
    _drained: Callable[[], None] | None = None
    _failed: bool = False
    _flushed: list[Callable[[], None]] = field(default_factory=list)
    _task: asyncio.Task[None] | None = None
    _timer: asyncio.TimerHandle | None = None
    disconnected: bool = False
    on_disconnect: Callable[[], None] | None = None

    # -- relay.ClientWriter ----------------------------------------------------------------
    def respond(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> bool:
        self._put({"type": "http.response.start", "status": status, "headers": headers})
        if len(body) > self.HIGH_WATER:
            # The end goes in a message of its own: the server's ``send`` waits for its
            # socket to drain before taking it, so ``when_flushed`` callbacks run only once
            # the client has taken the body (uvicorn's send drains first).
            self._queued += len(body)  # counted like a piece (the pump takes it off)
            self._put({"type": "http.response.body", "body": body, "more_body": True})
            body = b""
        self._put({"type": "http.response.body", "body": body, "more_body": False})
        return True  # queued: sent by the request's coroutine (``when_flushed`` then)

    def start_stream(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self._put({"type": "http.response.start", "status": status, "headers": headers})
        self.watch()  # streams last: watch for the client leaving from now on

    def write_piece(self, data: bytes) -> bool:
        self._queued += len(data)
        self._put({"type": "http.response.body", "body": data, "more_body": True})
        return self._queued > self.HIGH_WATER

    def end_stream(self, data: bytes) -> None:
        self._put({"type": "http.response.body", "body": data, "more_body": False})

    def when_drained(self, callback: Callable[[], None]) -> None:
        self._drained = callback

    def when_flushed(self, callback: Callable[[], None]) -> None:
        self._flushed.append(callback)

    def flushed(self) -> None:
        """The request's coroutine is done sending (or failed): run ``when_flushed``'s."""
        callbacks = self._flushed
        if callbacks:
            self._flushed = []
            for callback in callbacks:
                callback()

    def fail(self) -> None:
        self._failed = True
        self._poke()

    # -- the coroutine's side --------------------------------------------------------------
    def _put(self, message: Message) -> None:
        self._queue.append(message)
        self._poke()

    def _poke(self, _: object = None) -> None:
        wake = self._wake
        if wake is not None and not wake.done():
            wake.set_result(None)

    async def pump(self, done: asyncio.Future[None]) -> None:
        """Send what is queued, in order, until ``done`` (the request ended) and nothing is
        left; raises if the relay failed (the server then answers 500 or cuts the stream)."""
        done.add_done_callback(self._poke)
        if self._timer is None and self._task is None:
            self._timer = asyncio.get_running_loop().call_later(self.WATCH_AFTER_S, self.watch)
        queue = self._queue
        try:
            while True:
                while queue:
                    message = queue.popleft()
                    body = message.get("body")
                    if body and message["more_body"]:
                        self._queued -= len(body)
                    await self._send(message)
                if self._failed:
                    raise RuntimeError("relaying the engine's answer failed (logged above)")
                drained = self._drained
                if drained is not None:
                    self._drained = None
                    drained()
                    continue
                if done.done():
                    return
                self._wake = asyncio.get_running_loop().create_future()
                await self._wake
                self._wake = None
        finally:
            self._stop_watch()

    def watch(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._watch())

    def _stop_watch(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._task is not None and not self._task.done():
            self._task.cancel()

    async def _watch(self) -> None:
        receive = self._receive
        while (await receive())["type"] != "http.disconnect":
            pass
        self.disconnected = True
        callback = self.on_disconnect
        if callback is not None:
            self.on_disconnect = None
            callback()


# orjson (Rust, ~2 GB/s on string-heavy bodies vs ~0.1 GB/s for the stdlib here: dev/bench/proxy)
# refuses what the JSON RFC does: invalid UTF-8 (bodies must be UTF-8, RFC 8259), NaN/Infinity,
# numbers that overflow to infinity, nesting deeper than 1024; it also refuses lone surrogate
# escapes ("\ud800"), which no engine needs. Its errors are ValueErrors.
#
# simdjson (pysimdjson) validates a whole document without building Python objects: ~1-2 GB/s
# on a long chat history of many small messages, where orjson, which builds every dict and
# string, manages ~0.3-0.6 (dev/bench/proxy, issue 13). It is used for bodies of at least
# _SIMDJSON_FROM bytes (below that its per-call cost, ~9 us, is more than orjson's parse), and
# only to say yes: when it refuses a body, orjson's verdict is taken instead, so a body is
# refused only if orjson refuses it too (simdjson alone refuses integers beyond 64 bits and
# objects nested exactly 1024 deep, which orjson accepts; nothing was found the other way:
# tests/serving/test_proxy_input.py sends each case padded past the threshold).
_SIMDJSON_FROM = 16 * 1024
_SIMD_PARSER = simdjson.Parser()
# Objects with more top-level keys than this go to orjson: an OpenAI request has about 30
# parameters, and listing the keys of a very wide object costs more than orjson's parse.
_SIMD_MAX_KEYS = 64


def _check_simd(doc: Any) -> tuple[str | None, bool, bool] | None:
    """``check_body``'s verdict from a simdjson document; None: let orjson decide (a wide
    object, or `stream`/`stream_options`/`include_usage` given twice: simdjson would read the
    first, orjson and the engines' Python parsers the last)."""
    if not isinstance(doc, simdjson.Object):
        kind = "list" if isinstance(doc, simdjson.Array) else type(doc).__name__
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
        if isinstance(options, simdjson.Object):
            if len(options) > _SIMD_MAX_KEYS:
                return None
            option_keys = list(options.keys())
            if option_keys.count("include_usage") > 1:
                return None
            usage = "include_usage" in option_keys and options["include_usage"] is True
    if not isinstance(stream, bool):
        return "'stream' must be true or false", False, False
    return None, stream, usage


def check_body(body: bytes | memoryview) -> tuple[str | None, bool, bool]:
    """The request-body check: ``(problem, stream, include_usage)``; ``problem`` is None for
    a JSON object whose ``stream`` (if present) is a boolean, else what is wrong (a 400)."""
    if len(body) >= _SIMDJSON_FROM:
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
        data = orjson.loads(body)
    except (ValueError, RecursionError) as exc:
        return f"request body is not valid JSON ({exc.__class__.__name__})", False, False
    if not isinstance(data, dict):
        return f"request body must be a JSON object, got a JSON {type(data).__name__}", False, False
    stream = data.get("stream", False)
    if not isinstance(stream, bool):
        return "'stream' must be true or false", False, False
    options = data.get("stream_options")
    return None, stream, isinstance(options, dict) and options.get("include_usage") is True


# A worker polls this often for a slot freed by another worker while requests wait here.
WAIT_POLL_S = 0.01


@dataclass(slots=True, eq=False)
class _Waiter:
    """A request waiting for an in-flight slot (``ProxyApp._queue``)."""

    ex: Exchange
    key: int  # its index in the admission
    writer: ClientWriter
    seq: int
    # True once it has a slot; False when it was answered 429 or its client left
    granted: asyncio.Future[bool]
    timer: asyncio.TimerHandle | None = None

    def settle(self, admitted: bool) -> None:
        if not self.granted.done():
            self.granted.set_result(admitted)


class ProxyApp:
    """The ASGI application. One instance per process; state is the counters and the pool.

    ``share``: this process is one of ``--workers N`` (serving/proxy/workers.py): admission
    also takes a slot of the in-flight count all workers share, and /metrics sums all
    workers' metrics. None (one process): neither."""

    def __init__(
        self, config: ProxyConfig, keys: KeyRing, share: WorkerShare | None = None
    ) -> None:
        self.config = config
        self.share = share
        unknown = sorted(set(config.key_max_in_flight) - set(keys.names))
        if unknown:
            raise ValueError(
                f"proxy setting key_max_in_flight names key {unknown[0]!r}, which "
                f"SERVING_API_KEYS lacks (its keys: {', '.join(keys.names)}); name a key of "
                "SERVING_API_KEYS or remove that entry"
            )
        # Slots in flight per key, shared fairly (with --workers: in shared memory).
        cells, lock = share.in_flight if share is not None else (None, None)
        self.admission = Admission(
            config.max_in_flight, keys.names, dict(config.key_max_in_flight), cells, lock
        )
        # Requests of this process waiting for a slot, oldest first (see ``_queue``).
        self._waiters: collections.deque[_Waiter] = collections.deque()
        self._waiter_seq = itertools.count()
        self._wait_poll: asyncio.TimerHandle | None = None
        # The access line's last field, and the readiness events': which worker (none with
        # one process).
        self._log_tail = f',"worker":{share.index}' if share is not None else ""
        self._event_tags = {"worker": share.index} if share is not None else {}
        self.buffered_bytes = 0  # request + non-stream response bodies held (max_buffered_bytes)
        # Request-body bytes held per key: each key may hold its share of the budget at most,
        # so one key's uploads never keep another key from its share (issue 22 item 2).
        self.key_share = max(
            config.max_body_bytes, config.max_buffered_bytes // max(1, len(keys.names))
        )
        self.key_held = dict.fromkeys(keys.names, 0)
        self.keys = keys
        self.metrics = Metrics()
        self.client = UpstreamClient(
            config.upstream,
            connect_retries=config.connect_retries,
            idle_ttl_s=config.upstream_idle_s,
            max_connecting=config.upstream_max_connecting,
        )
        self.ready = False
        self._ready_reason = "engine health not checked yet"
        self._failed_polls = 0  # consecutive failed /health polls
        self._poller: asyncio.Task[None] | None = None
        self._stopping = False
        self._emit_access: Callable[[str], None] = _access_emitter()
        # Request ids: a random per-process prefix + a counter (no syscall per request).
        self._id_prefix = os.urandom(8).hex().encode()
        self._id_counter = itertools.count(1)
        self._retry_after = {
            _BUSY: [(b"retry-after", str(config.retry_after_busy_s).encode())],
            _NOT_READY: [(b"retry-after", str(config.retry_after_not_ready_s).encode())],
        }

    # -- lifecycle -------------------------------------------------------------------------
    async def startup(self) -> None:
        self._stopping = False
        self._emit_access = _access_emitter()
        self._poller = asyncio.get_running_loop().create_task(self._poll_health())
        if self.share is not None:
            self.share.start(self.metrics)

    async def shutdown(self) -> None:
        self._stopping = True
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
            self._poller = None
        if self._wait_poll is not None:
            self._wait_poll.cancel()
            self._wait_poll = None
        self.client.close()
        if self.share is not None:
            self.share.stop()
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
        changed = ready != self.ready
        if changed:
            log_event(
                logging.WARNING, "engine_ready" if ready else "engine_not_ready", reason=reason,
                upstream=self.config.upstream, **self._event_tags,
            )  # fmt: skip
        self.ready = ready
        self.metrics.engine_ready = ready
        self._ready_reason = reason
        if changed and self.share is not None:
            with contextlib.suppress(OSError):
                self.share.publish()  # the other workers' /metrics see it at once

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
            log_event(
                logging.WARNING, "engine_health_failed", reason=reason,
                failed_in_a_row=self._failed_polls,
                unready_after=self.config.unready_after_failures, **self._event_tags,
            )  # fmt: skip

    async def _check_health(self) -> tuple[bool, str]:
        try:
            resp = await self.client.request(b"GET", b"/health", [], retry_connect=False)
        except UpstreamError as exc:
            return False, str(exc)
        try:
            await resp.head()
            await resp.read_all(1 << 16)
        except UpstreamError as exc:
            return False, str(exc)
        finally:
            # Cancelled by the poller's timeout: close the connection (an engine that never
            # answers would otherwise collect one open connection per poll).
            if not resp.finished:
                resp.abort()
        if resp.status == 200:
            return True, "engine /health answered 200"
        return False, f"engine /health answered {resp.status}"

    # -- requests --------------------------------------------------------------------------
    # Each step answers the client itself when it says no and returns False (or None).
    # ``_end`` closes every request exactly once: in-flight slot and buffer budget back,
    # metrics, access log.

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        t0 = time.perf_counter()
        kind = scope["type"]
        if kind != "http":
            if kind == "lifespan":
                await self._lifespan(receive, send)
            return  # websockets are not served (uvicorn runs with ws="none")
        raw_path = scope.get("raw_path") or scope["path"].encode("latin-1")
        ex, auth, auth_count, content_length, forward = self._begin(
            t0, raw_path, scope["method"], scope["headers"]
        )
        writer = _AsgiWriter(send, receive)
        done = ex.done = self.client.running_loop().create_future()
        try:
            admitted: bool | None = False
            body: bytes | memoryview | None = None
            if (
                self._front(writer, ex, auth, auth_count)
                and (body := await self._read_body(receive, writer, ex, content_length)) is not None
            ):
                admitted = self._admit(writer, ex)
                if admitted is None:  # waits for a slot; a client that leaves meanwhile
                    # gives up its place at once (its 499 is logged then)
                    granted = self._queue(writer, ex)
                    writer.watch()
                    admitted = await granted
            if admitted and body is not None:
                await self._send(writer, ex, body, forward)
            else:
                self._end(ex)
            await writer.pump(done)
        except BaseException as exc:
            relay = ex.relay
            if relay is not None:
                relay.abandon()  # the engine stops generating for nobody
            if isinstance(exc, Exception):  # a bug of ours: the server answers 500 or cuts
                self._internal_error(ex, exc)
            raise
        finally:
            writer.flushed()
            self._end(ex)

    def _begin(
        self, t0: float, raw_path: bytes, method: str, headers: Iterable[tuple[bytes, bytes]]
    ) -> tuple[Exchange, bytes | None, int, bytes | None, list[tuple[bytes, bytes]]]:
        """The request's facts from its head: the exchange, the Authorization header and how
        many there were, Content-Length, the headers to forward."""
        route = ROUTES.get(raw_path, _UNMATCHED)
        auth: bytes | None = None
        auth_count = 0
        request_id: bytes | None = None
        content_length: bytes | None = None
        chunked = False
        connection: bytes | None = None
        forward: list[tuple[bytes, bytes]] = []
        for name, value in headers:
            kind = _HEADER_KINDS.get(name)
            if kind is None:  # most headers (host, content-type, ...): one dict lookup
                continue
            if kind == _AUTHORIZATION:
                auth = value
                auth_count += 1
            elif kind == _FORWARD:
                forward.append((name, value))
            elif kind == _CONTENT_LENGTH:
                content_length = value
            elif kind == _REQUEST_ID:
                request_id = value
            elif kind == _TRANSFER_ENCODING:
                chunked = True
            else:
                connection = value if connection is None else connection + b"," + value
        if connection is not None and forward:
            # Headers the client names in Connection are hop-by-hop (RFC 9110 7.6.1).
            hop = {token.strip().lower() for token in connection.split(b",")}
            forward = [(name, value) for name, value in forward if name not in hop]
        if request_id is None or not _REQUEST_ID_RE.fullmatch(request_id):
            request_id = b"%s%08x" % (self._id_prefix, next(self._id_counter))
        ex = Exchange(t0, route, request_id, method, raw_path)
        if chunked or (content_length is not None and content_length != b"0"):
            ex.body_unread = True
        return ex, auth, auth_count, content_length, forward

    def _internal_error(self, ex: Exchange, exc: Exception) -> None:
        ex.status = ex.status or 500  # set only once a response head was handed over
        ex.error = f"proxy_internal_error: {exc.__class__.__name__}"
        event_log.error("proxy internal error", exc_info=exc)

    def _end(self, ex: Exchange) -> None:
        """The request is over (answered, failed or abandoned): once per request."""
        if ex.ended:
            return
        ex.ended = True
        ex.duration = time.perf_counter() - ex.t0
        if ex.admitted:
            self.metrics.in_flight -= 1
            self.admission.give_back(self.admission.index[ex.key])
            if self._waiters:  # the freed slot goes to a request waiting here, if it may
                self.client.running_loop().call_soon(self._serve_waiters)
        elif ex.waiter is not None:  # ended while waiting (the ASGI coroutine cancelled)
            self._unqueue(ex.waiter)
        if ex.body_held:
            self.key_held[ex.key] -= ex.body_held
            ex.body_held = 0
        self.buffered_bytes -= ex.held  # the request body, and a response read whole
        ex.held = 0
        done = ex.done
        if done is not None and not done.done():
            done.set_result(None)
        self._account(ex)

    # -- steps -----------------------------------------------------------------------------
    def _front(
        self, writer: ClientWriter, ex: Exchange, auth: bytes | None, auth_count: int
    ) -> bool:
        """Route, method, the proxy's own routes, key, readiness; True: go on to the engine."""
        route = ex.route
        if route.kind < 0:
            self.answer_error(writer, ex, "route_not_found", "no such route")
        elif ex.method != route.method:
            self.answer_error(
                writer, ex, "method_not_allowed", f"method not allowed; use {route.method}",
                [(b"allow", route.method.encode())],
            )  # fmt: skip
        elif route.kind == _HEALTH:
            self.answer(writer, ex, 200, b'{"status":"ok"}')
        elif route.kind == _READY:
            if self.ready:
                self.answer(writer, ex, 200, b'{"ready":true}')
            else:
                self.answer_error(writer, ex, "engine_not_ready", self._not_ready_message())
        elif self._authenticate(writer, ex, auth, auth_count):
            if route.kind == _METRICS:
                share, metrics = self.share, self.metrics
                metrics.waiting = self.admission.waiting
                self.answer(
                    writer, ex, 200,
                    metrics.render() if share is None else share.render(metrics, self.admission),
                    (b"content-type", b"text/plain; version=0.0.4; charset=utf-8"),
                )  # fmt: skip
            elif not self.ready:
                self.answer_error(writer, ex, "engine_not_ready", self._not_ready_message())
            else:
                return True
        return False

    def _authenticate(
        self, writer: ClientWriter, ex: Exchange, auth: bytes | None, count: int
    ) -> bool:
        key = parse_bearer(auth) if count == 1 else None
        if key is None:
            why = "missing" if count == 0 else "malformed (expected one 'Bearer <key>')"
            self.answer_error(
                writer, ex, "missing_api_key" if count == 0 else "malformed_authorization",
                f"Authorization header {why}", [(b"www-authenticate", b"Bearer")],
            )  # fmt: skip
            return False
        name = self.keys.match(key)
        if name is None:
            self.answer_error(writer, ex, "invalid_api_key", "API key not recognised")
            return False
        ex.key = name
        return True

    def _not_ready_message(self) -> str:
        return f"engine not ready: {self._ready_reason}"

    def _announced(self, writer: ClientWriter, ex: Exchange, content_length: bytes | None) -> bool:
        """The announced body size: well-formed (400), within the limit (413). It reserves
        nothing: the body's bytes are charged to the buffer budget as they arrive."""
        if content_length is None:
            return True
        if not content_length.isdigit():
            self.answer_error(writer, ex, "invalid_content_length", "malformed Content-Length")
            return False
        if int(content_length) > self.config.max_body_bytes:
            self._body_too_large(writer, ex)
            return False
        return True

    async def _read_body(
        self,
        receive: Receive,
        writer: ClientWriter,
        ex: Exchange,
        content_length: bytes | None,
    ) -> bytes | memoryview | None:
        """The request's body, checked as its pieces arrive: a GET route takes none (400),
        the size (413, chunked bodies too), each piece charged to the buffer budget and the
        key's share of it (503), then the JSON check (400); None: answered (or the client
        left). The whole body must have arrived by t0 + ``body_timeout_s`` (408)."""
        if ex.route.method != "POST":
            if ex.body_unread:  # not read: the answer closes the connection
                # Refused like an invalid POST body, never forwarded (issue 22 item 4).
                route = ex.route
                problem = f"{route.method} {route.path.decode()} takes no request body"
                self.answer_error(writer, ex, "unexpected_body", problem)
                return None
            return b""
        if not self._announced(writer, ex, content_length):
            return None
        loop = self.client.running_loop()
        deadline = loop.time() + self.config.body_timeout_s - (time.perf_counter() - ex.t0)
        limit = self.config.max_body_bytes
        parts: list[bytes] = []
        size = 0
        # A large announced body is collected in one mapping (see _COLLECT_FROM).
        sink = None
        if content_length is not None and int(content_length) >= _COLLECT_FROM:
            sink = mmap.mmap(-1, int(content_length))
        try:
            async with asyncio.timeout_at(deadline):
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        ex.client_gone = True
                        return None
                    chunk = message.get("body", b"")
                    end = size + len(chunk)
                    if end > limit:
                        self._body_too_large(writer, ex)
                        return None
                    if not self.hold_body(ex, len(chunk)):  # charged as it arrives
                        self.answer_buffers_full(writer, ex)
                        return None
                    if sink is not None and end > len(sink):  # more than announced
                        parts.append(bytes(sink[:size]))
                        sink = None
                    if sink is not None:
                        sink[size:end] = chunk
                    else:
                        parts.append(chunk)
                    size = end
                    if not message.get("more_body", False):
                        break
        except TimeoutError:
            problem = f"request body not received within {self.config.body_timeout_s:g} s"
            self.answer_error(writer, ex, "request_timeout", problem)
            return None
        ex.body_unread = False
        body: bytes | memoryview
        if sink is not None and not parts:
            body = memoryview(sink)[:size]
        else:
            body = parts[0] if len(parts) == 1 else b"".join(parts)
        return body if self._validate(writer, ex, body) else None

    def _validate(self, writer: ClientWriter, ex: Exchange, body: bytes | memoryview) -> bool:
        problem, ex.stream, ex.wants_usage = check_body(body)
        if problem is None:
            return True
        self.answer_error(writer, ex, "invalid_json", problem)
        return False

    def _admit(self, writer: ClientWriter, ex: Exchange) -> bool | None:
        """The in-flight cap, shared fairly between keys (serving/proxy/admission.py); the
        body was read first, so a slow body holds only its share of the buffer budget (and at
        most body_timeout_s), never a slot. True: admitted; False: answered 429; None: the
        pool is full and the key is below its fair share, it waits (``_queue`` next)."""
        i = self.admission.index[ex.key]
        decided = self.admission.take(i)
        if decided == ADMITTED:
            self._admitted(ex)
            return True
        if decided == QUEUED:
            return None
        self._refuse(writer, ex, i, decided)
        return False

    def _admitted(self, ex: Exchange) -> None:
        self.metrics.in_flight += 1
        ex.admitted = True

    def _refuse(self, writer: ClientWriter, ex: Exchange, i: int, decided: int) -> None:
        """429 naming the key (never its value), what it holds and what to do."""
        admission = self.admission
        name = ex.key
        if decided == KEY_LIMIT:
            message = (
                f"key '{name}' is at its own limit of {admission.limits[i]} requests in flight "
                "(proxy.key_max_in_flight); retry after the Retry-After delay, or raise that "
                "key's limit"
            )
            code = "key_at_limit"
        else:
            message = (
                f"proxy at capacity ({admission.pool} requests in flight at most): key "
                f"'{name}' holds {admission.held(i)}, at or above its fair share of "
                f"{admission.share(i)} while other requests want a slot (slots that come "
                "free go to keys below their share first); retry after the Retry-After delay"
            )
            code = "proxy_at_capacity"
        self.answer_error(writer, ex, code, message)

    # -- waiting for a slot ----------------------------------------------------------------
    # A request of a key below its fair share, when the pool is full, waits here up to
    # fair_wait_s. Slots come free when a request of this process ends (``_end`` serves the
    # waiters at once) or of another worker (a poll every WAIT_POLL_S while any waits here).

    def _queue(self, writer: ClientWriter, ex: Exchange) -> asyncio.Future[bool]:
        """Wait for a slot (``admission.take`` said QUEUED): the future is True once it has
        one (``ex.admitted``), False when it was answered 429 after fair_wait_s or its client
        left."""
        loop = self.client.running_loop()
        waiter = _Waiter(
            ex, self.admission.index[ex.key], writer, next(self._waiter_seq), loop.create_future()
        )
        waiter.timer = loop.call_later(self.config.fair_wait_s, self._wait_timed_out, waiter)
        ex.waiter = waiter
        self._waiters.append(waiter)
        if writer.on_disconnect is None and not writer.disconnected:
            writer.on_disconnect = functools.partial(self._left_waiting, waiter)
        if self._wait_poll is None:
            self._wait_poll = loop.call_later(WAIT_POLL_S, self._poll_waiters)
        return waiter.granted

    def _stop_waiting(self, waiter: _Waiter) -> None:
        """``waiter`` waits here no more (its count in the admission is the caller's)."""
        waiter.ex.waiter = None
        if waiter.timer is not None:
            waiter.timer.cancel()
        with contextlib.suppress(ValueError):
            self._waiters.remove(waiter)
        if not waiter.writer.disconnected:
            waiter.writer.on_disconnect = None

    def _unqueue(self, waiter: _Waiter) -> None:
        """``waiter`` stops waiting (no slot): its count in the admission goes."""
        self._stop_waiting(waiter)
        self.admission.leave(waiter.key)
        if self._waiters:  # one leaving may let another take a free slot
            self.client.running_loop().call_soon(self._serve_waiters)

    def _left_waiting(self, waiter: _Waiter) -> None:
        if waiter.ex.waiter is waiter:
            waiter.ex.client_gone = True
            self._unqueue(waiter)
            waiter.settle(False)

    def _wait_timed_out(self, waiter: _Waiter) -> None:
        ex = waiter.ex
        if ex.waiter is not waiter:
            return
        waiter.timer = None
        self._unqueue(waiter)
        admission = self.admission
        i = waiter.key
        self.answer_error(
            waiter.writer, ex, "proxy_at_capacity",
            f"proxy at capacity ({admission.pool} requests in flight at most): no slot came "
            f"free within {self.config.fair_wait_s:g} s for key '{ex.key}' (it holds "
            f"{admission.held(i)}, its fair share is {admission.share(i)}); retry after the "
            "Retry-After delay",
        )  # fmt: skip
        waiter.settle(False)

    def _poll_waiters(self) -> None:
        self._wait_poll = None
        self._serve_waiters()
        if self._waiters:
            self._wait_poll = self.client.running_loop().call_later(WAIT_POLL_S, self._poll_waiters)

    def _serve_waiters(self) -> None:
        """Give free slots to the requests waiting here: the key holding least first, then
        the oldest."""
        waiters = self._waiters
        if not waiters:
            return
        admission = self.admission
        order = sorted(waiters, key=lambda w: (admission.held(w.key), w.seq))
        for waiter in order:
            if admission.total >= admission.pool:
                return
            ex = waiter.ex
            if ex.waiter is not waiter:
                continue
            decided = admission.retry(waiter.key)
            if decided == QUEUED:
                continue
            self._stop_waiting(waiter)  # retry took its count off
            if decided == ADMITTED:
                self._admitted(ex)
                waiter.settle(True)
            else:
                self._refuse(waiter.writer, ex, waiter.key, decided)
                waiter.settle(False)

    async def _send(
        self,
        writer: ClientWriter,
        ex: Exchange,
        body: bytes | memoryview,
        forward: list[tuple[bytes, bytes]],
    ) -> None:
        """Send to the engine, on an idle pooled connection (no wait) or a new one (retried
        while the engine refuses to connect: it saw nothing), then relay its answer; answers
        503 when it cannot be reached."""
        client = self.client
        retries_before = client.retries
        route = ex.route
        headers = [*forward, (b"x-request-id", ex.request_id)]
        if route.method == "POST":
            headers.append(_JSON)  # validated JSON, whatever the client labelled it
        try:
            try:
                resp = await client.request(
                    route.method_bytes, route.path, headers, body,
                    head_timeout_s=self.config.upstream_timeout_s,
                )  # fmt: skip
            finally:
                self.metrics.connect_retries += client.retries - retries_before
        except ConnectFailed as exc:
            self.metrics.upstream_errors["connect"] += 1
            self._set_ready(False, str(exc))
            self.answer_error(writer, ex, "engine_unreachable", f"engine unreachable: {exc}")
            self._end(ex)
            return
        self._relay(writer, ex, resp)

    def _relay(self, writer: ClientWriter, ex: Exchange, resp: UpstreamResponse) -> None:
        t_sent = time.perf_counter()
        # The request body's share of the budget is free again once the engine's socket has
        # taken it (until then its bytes wait in the connection's write buffer).
        if resp.request_pending:
            resp.when_request_written(functools.partial(self.body_written, ex))
        else:
            self.body_written(ex)
        relay = ex.relay = Relay(self, ex, writer, self._relay_done)
        relay.start(resp, t_sent)

    def _relay_done(self, relay: Relay) -> None:
        ex = relay.ex
        if relay.backlogged and (response := ex.held - ex.body_held):  # a whole answer's bytes
            # The client has not taken the answer yet: its bytes stay in the budget until it
            # has (or has gone), so that clients that do not read cannot pile up answers.
            ex.held -= response
            relay.writer.when_flushed(functools.partial(self._give_back, response))
        self._end(ex)

    def hold(self, ex: Exchange, size: int) -> bool:
        """Take ``size`` bytes of the buffer budget for ``ex`` (a non-stream answer being
        read; False: not available). ``_end`` gives back what the request held."""
        if self.buffered_bytes + size > self.config.max_buffered_bytes:
            return False
        self.buffered_bytes += size
        ex.held += size
        return True

    def hold_body(self, ex: Exchange, size: int) -> bool:
        """Take ``size`` bytes of request body for ``ex``, as they arrive: within the budget
        and within the key's share of it (False: not available; ``ex.share_full`` says
        which). Given back once the engine's socket has taken the body, or at ``_end``."""
        key_held = self.key_held
        held = key_held[ex.key] + size
        if held > self.key_share:
            ex.share_full = True
            return False
        if self.buffered_bytes + size > self.config.max_buffered_bytes:
            return False
        key_held[ex.key] = held
        self.buffered_bytes += size
        ex.held += size
        ex.body_held += size
        return True

    def body_written(self, ex: Exchange) -> None:
        """The engine's socket has taken the request body: its bytes are free again."""
        size = ex.body_held
        if size:
            ex.body_held = 0
            ex.held -= size
            self.buffered_bytes -= size
            self.key_held[ex.key] -= size

    def _give_back(self, size: int) -> None:
        self.buffered_bytes -= size

    def answer_buffers_full(self, writer: ClientWriter, ex: Exchange) -> None:
        if ex.share_full:
            why = (
                f"this key's share of the proxy's body buffers is full ({self.key_share} "
                "bytes of request bodies held)"
            )
        else:
            why = (
                f"proxy buffers full ({self.config.max_buffered_bytes} bytes of request and "
                "response bodies held)"
            )
        self.answer_error(
            writer, ex, "proxy_buffers_full", f"{why}; retry after the Retry-After delay"
        )

    def _body_too_large(self, writer: ClientWriter, ex: Exchange) -> None:
        problem = f"request body larger than {self.config.max_body_bytes} bytes"
        self.answer_error(writer, ex, "request_too_large", problem)

    # -- answers ---------------------------------------------------------------------------
    def answer(
        self,
        writer: ClientWriter,
        ex: Exchange,
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
            # a GET /health with a body): close the connection rather than read and discard
            # it, whatever its size.
            headers.append((b"connection", b"close"))
        ex.status = status
        writer.respond(status, headers, body)

    def answer_error(
        self,
        writer: ClientWriter,
        ex: Exchange,
        code: str,
        message: str,
        extra: list[tuple[bytes, bytes]] | None = None,
    ) -> None:
        """An OpenAI-style error answer; status, type and Retry-After follow from ``code``
        (``ERRORS``)."""
        status, type_, retry = ERRORS[code]
        if retry is not None:
            extra = [*(extra or ()), *self._retry_after[retry]]
        ex.error = code
        self.answer(writer, ex, status, error_body(message, type_, code), _JSON, extra)

    @staticmethod
    def _logged_path(ex: Exchange) -> str:
        logged = _LOGGED_PATH.get(ex.route.name)
        if logged is not None:
            return logged
        return f'"path":null,"path_sha256":"{path_fingerprint(ex.path)}","path_len":{len(ex.path)}'

    def _account(self, ex: Exchange) -> None:
        for seen in ex.usage_seen:
            scan_usage(seen, ex)
        duration = ex.duration
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
                f'"error":{"null" if ex.error is None else _json_str(ex.error)}{self._log_tail}}}'
            )
