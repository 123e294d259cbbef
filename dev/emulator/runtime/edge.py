"""The edge: every web endpoint's URL, reachable from this machine as printed.

Modal gives each endpoint `https://<workspace>[-<env>]--<label>.modal.run`. Those names do not
resolve here, and Python cannot resolve `*.localhost` either (measured), so the emulator gives
each endpoint its own loopback port instead: its URL is `http://127.0.0.1:<port>` and is what
FunctionCreate answers, what `modal deploy` prints and what `Server.get_url()` returns.
curl, httpx and LiteLLM reach it with no DNS or hosts-file setup, and the path is the app's
own (`/v1/chat/completions` stays at the root, as on Modal).

Stability: the label -> port table is kept in `<data dir>/edge-ports.json`. A redeploy keeps
the label and so the port; an emulator restart on the same state re-binds the same ports. If
a port was taken meanwhile by something else, the endpoint gets a new one (logged as a
warning): the trade-off of one port per endpoint instead of a path prefix on one port (which
would have kept one port but moved every app's routes under a prefix).

Per request (HTTP/1.1, keep-alive, chunked or sized bodies, streaming responses, 1xx and
protocol upgrades passed through):
1. no live app serves the URL -> 404 `modal-http: app for invoked web endpoint is stopped`;
2. proxy auth, when the endpoint requires it (`@app.server` unless `unauthenticated=True`;
   `requires_proxy_auth=True` elsewhere): `Modal-Key` + `Modal-Secret` headers, or
   `Authorization: Bearer <token id>.<token secret>` (also `:`), checked like Modal's edge
   (environment-scoped under `--rbac`); otherwise 401 and no container is started. The
   credentials are removed before the request reaches the container;
3. a ready container with a free slot (cold start when none), 429 when every container is at
   `max_concurrency` and `max_containers` is reached, 503 when the container meant for it
   failed to start;
4. if the response has not started after the webhook timeout (150 s, Modal's; a flag), the
   caller gets 303 to the same URL with `__modal_function_call_id=<id>`, which waits (again up
   to the timeout, then 303 again) and answers the result, as modal.com/docs/guide/
   webhook-timeouts describes.

What a client may send (issue 22 item 5: 19,995 idle connections exhausted the emulator's
open files, `Content-Length: -1` made it buffer a whole connection, `Transfer-Encoding:
xchunked` got no answer and a traceback). Client requests are parsed by httptools (llhttp,
as the serving proxy's own server and uvicorn), never by hand, and held to the serving
proxy's limits (docs/proxy.md "Limits on what clients send"; `EdgeLimits`): a request head
of at most 32 KiB (431), complete 10 s after the connection opened or after the previous
answer (408; a connection that sent nothing is closed), a body of at most 4 MiB (413,
answered from `Content-Length` before a byte of it is read) that may keep the edge waiting
for its bytes 60 s in all (408; time the edge itself holds reading back, during a cold start
or while a container takes the body slowly, does not count), idle keep-alive connections
closed after 75 s, at most 16 requests read ahead of the one being answered, and at most 1024
client connections open at once on all the edge's ports. At that cap a new connection takes the
place of the oldest one that has not shown valid credentials yet (issue 32 item 14: 1,024
half-sent heads without credentials used to lock every authenticated client out until they
timed out), else of the longest-idle keep-alive connection, else it is closed as it is
accepted (see `Edge.make_room`). Malformed framing (a bad or duplicate
`Content-Length`, `Content-Length` with `Transfer-Encoding`, bad chunk sizes, NUL or bare
CR/LF in a header) is 400; a transfer coding other than chunked, and CONNECT, are 501 (RFC
9112 6.1). Every such answer closes the connection, FIN first, then reads and drops what the
client still sends for at most 2 s (the proxy's lingering close). A refused or broken request
is one log line, at most 5 per 10 s per kind (then one line counting the ones not shown),
never a traceback.

A web function's request body reaches the container as ASGI messages it asks for
(FunctionCallGetDataIn): the edge reads the client no faster than the container takes them
(at most 1 MiB not yet taken per request), so a body never piles up in the emulator.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import socket
import time
import urllib.parse
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httptools
from modal_proto import api_pb2

from emulator.ids import new_id
from emulator.runtime import netns
from emulator.runtime.containers import Container
from emulator.runtime.manager import NoCapacity, Pool, Runtime, StartFailed

log = logging.getLogger("emulator.edge")

#: The largest response head a container may send (its own headers; 502 above).
MAX_UPSTREAM_HEAD = 64 * 1024
_HOP = {"connection", "keep-alive", "proxy-connection", "te", "trailer", "upgrade"}
RESULT_PARAM = "__modal_function_call_id"
_REASONS = {
    303: "See Other",
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    408: "Request Timeout",
    413: "Content Too Large",
    429: "Too Many Requests",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    501: "Not Implemented",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}
#: Requests parsed ahead of the one being answered, at most (the proxy's MAX_PIPELINE).
MAX_PIPELINE = 16
#: Reading a client stops while this many body bytes wait for the container to take them.
MAX_UNREAD_BODY = 1024 * 1024
#: A connection closed after an answer reads and drops what still comes for at most this long
#: (closing with unread bytes makes the kernel answer RST, which can destroy the answer).
LINGER_S = 2.0


@dataclass(frozen=True)
class EdgeLimits:
    """What one client may send the edge: the serving proxy's limits (docs/proxy.md)."""

    max_head_bytes: int = 32 * 1024
    head_timeout_s: float = 10.0
    keepalive_timeout_s: float = 75.0
    max_body_bytes: int = 4 * 1024 * 1024
    body_timeout_s: float = 60.0
    max_connections: int = 1024


class _LogLines:
    """One warning line per event, at most `burst` per `window_s` for each kind; the first
    line after a suppressed stretch says how many were not shown. Never a traceback."""

    def __init__(self, burst: int = 5, window_s: float = 10.0) -> None:
        self.burst = burst
        self.window_s = window_s
        self._windows: dict[str, tuple[float, int, int]] = {}  # kind -> (start, shown, dropped)

    def warn(self, kind: str, message: str, *args: Any) -> None:
        self.note(kind, logging.WARNING, message, *args)

    def note(self, kind: str, level: int, message: str, *args: Any) -> None:
        now = time.monotonic()
        start, shown, dropped = self._windows.get(kind, (now, 0, 0))
        if now - start > self.window_s:
            start, shown = now, 0
        if shown >= self.burst:
            self._windows[kind] = (start, shown, dropped + 1)
            return
        if dropped:
            message += f" ({dropped} more like it in the last {self.window_s:.0f} s not shown)"
        self._windows[kind] = (start, shown + 1, 0)
        log.log(level, message, *args)


class _BadRequest(Exception):
    pass


class _BodyFailed(Exception):
    """The request body cannot be read: `status` is the answer (400, 408, 413)."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status = status
        self.text = text


class _ClientGone(Exception):
    pass


class _ReadAheadFull(Exception):
    """Raised from a parser callback to stop parsing: MAX_PIPELINE requests are queued."""


def _label(pattern_url: str) -> str:
    host = urllib.parse.urlsplit(pattern_url).hostname or pattern_url
    return host.removesuffix(".modal.run")


class Head:
    __slots__ = ("first", "headers")

    def __init__(self, first: str, headers: list[tuple[str, str]]) -> None:
        self.first = first
        self.headers = headers

    def get(self, name: str) -> str | None:
        name = name.lower()
        for k, v in self.headers:
            if k.lower() == name:
                return v
        return None

    def without(self, names: set[str]) -> list[tuple[str, str]]:
        return [(k, v) for k, v in self.headers if k.lower() not in names]

    def encode(self, headers: list[tuple[str, str]] | None = None) -> bytes:
        hs = self.headers if headers is None else headers
        lines = [self.first] + [f"{k}: {v}" for k, v in hs]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


class _Refusal:
    """An answer the connection owes in place of a request it could not parse; then close."""

    __slots__ = ("status", "text")

    def __init__(self, status: int, text: str) -> None:
        self.status = status
        self.text = text


class _Request:
    """One parsed client request: its head, and its body as the parser delivers it."""

    def __init__(
        self,
        conn: _ClientConnection,
        method: str,
        target: str,
        version: str,
        headers: list[tuple[str, str]],
        keep_alive: bool,
        content_length: int | None,
        chunked: bool,
    ) -> None:
        self.conn = conn
        self.method = method
        self.target = target
        self.head = Head(f"{method} {target} HTTP/{version}", headers)
        self.keep_alive = keep_alive
        self.content_length = content_length
        self.chunked = chunked
        self.upgrade = False
        #: The body's clock: time spent waiting for body bytes the edge asked for (not time
        #: the edge itself held reading back: a cold start, a container taking it slowly).
        self.waited = 0.0
        self.wait_started: float | None = None
        self.pieces: collections.deque[bytes] = collections.deque()
        self.buffered = 0  # bytes parsed and not yet taken
        self.received = 0
        self.complete = False  # the whole body was parsed
        self.failure: _BodyFailed | None = None
        self._waiter: asyncio.Future[None] | None = None

    @property
    def has_body(self) -> bool:
        return self.chunked or bool(self.content_length)

    def wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def fail(self, status: int, text: str) -> None:
        if self.failure is None and not self.complete:
            self.failure = _BodyFailed(status, text)
            self.wake()

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body, decoded (sized or chunked), piece by piece as it arrives."""
        while True:
            if self.pieces:
                piece = self.pieces.popleft()
                self.buffered -= len(piece)
                self.conn.body_taken(self)
                yield piece
                continue
            if self.failure is not None:
                raise self.failure
            if self.complete:
                return
            if self.conn.lost:
                raise _ClientGone
            self.conn.wants_body(self)
            loop = self.conn.loop
            self._waiter = loop.create_future()
            self.wait_started = loop.time()
            try:
                await self._waiter
            finally:
                self._waiter = None
                self.waited += loop.time() - self.wait_started
                self.wait_started = None

    def body_overdue(self, now: float, limit: float) -> bool:
        """True once the edge has waited `limit` seconds in all for this body's bytes."""
        waiting = now - self.wait_started if self.wait_started is not None else 0.0
        return self.waited + waiting > limit


class _ClientConnection(asyncio.Protocol):
    """One client connection: httptools parses it, `Edge._serve_connection` answers it.

    Requests (or the refusal of one that could not be parsed) are queued in order; the
    serving coroutine takes them one at a time. Reading pauses while a body waits for the
    container or a request waits behind the one being answered.
    """

    def __init__(self, edge: Edge, url: str) -> None:
        self.edge = edge
        self.url = url
        self.limits = edge.limits
        self.loop = asyncio.get_running_loop()
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.queue: collections.deque[_Request | _Refusal] = collections.deque()
        self.parsing: _Request | None = None  # the request whose body is arriving
        self.active: _Request | None = None  # the request being answered
        self.lost = False
        self.eof = False  # the client closed its sending side
        self.closing = False  # no more requests are taken from this connection
        self.stopped = False  # the parser is stopped: what arrives is dropped
        self.reading_paused = False
        self.write_paused = False
        self.linger_until: float | None = None
        self.upgraded = False  # after an upgrade request: raw bytes, no more HTTP
        self.raw: collections.deque[bytes] = collections.deque()
        self.raw_bytes = 0
        self._waiter: asyncio.Future[None] | None = None
        self._drain: asyncio.Future[None] | None = None
        self.task: asyncio.Task[None] | None = None
        # head parsing
        self.in_head = True
        self.head_bytes = 0
        self.head_t0: float | None = None
        self.idle_since: float | None = None
        self._url = b""
        self._headers: list[tuple[str, str]] = []
        self._parsed_head = 0
        self._bad_coding = ""
        #: A request on it passed the endpoint's proxy auth (or the endpoint needs none): at
        #: the connection cap it is closed only after every connection that has not (and
        #: only when idle). Until then it is in `Edge.unproven`, oldest first.
        self.proven = False
        self.opened_at: float | None = None

    # ---- asyncio.Protocol ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        edge = self.edge
        if len(edge.connections) >= self.limits.max_connections and not edge.make_room(self.url):
            self.lost = True
            edge.lines.warn(
                "connections",
                "edge: %d client connections are open (the cap), each serving a request or "
                "holding one read ahead: a new one on %s was closed",
                len(edge.connections),
                self.url,
            )
            transport.abort()  # type: ignore[attr-defined]
            return
        edge.connections.add(self)
        edge.unproven[self] = None
        self.head_t0 = self.opened_at = self.loop.time()
        sock = transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.task = self.loop.create_task(edge._serve_connection(self))
        edge.track(self.task)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self.closing = True
        self.edge.connections.discard(self)
        self.edge.unproven.pop(self, None)
        for req in (self.active, self.parsing, *[q for q in self.queue if isinstance(q, _Request)]):
            if req is not None:
                req.wake()
        self._wake()
        drain = self._drain
        if drain is not None and not drain.done():
            drain.set_result(None)

    def data_received(self, data: bytes) -> None:
        if self.lost:
            return
        if self.upgraded:
            self.raw.append(data)
            self.raw_bytes += len(data)
            if self.raw_bytes > MAX_UNREAD_BODY:
                self._pause_reading()
            self._wake()
            return
        if self.stopped:
            return  # refused or lingering: dropped
        if self.in_head:
            if self.head_t0 is None:
                self.head_t0 = self.loop.time()
            self.head_bytes += len(data)
            self.idle_since = None
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade as exc:
            self._upgraded(data[int(exc.args[0]) :] if exc.args else b"")
            return
        except _ReadAheadFull:
            self.stopped = True
            return
        except httptools.HttpParserError as exc:
            self._parse_error(exc)
            return
        if self.in_head and self.head_bytes > self.limits.max_head_bytes:
            self.refuse(431, "request head too large")

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        drain = self._drain
        if drain is not None and not drain.done():
            drain.set_result(None)

    def eof_received(self) -> bool | None:
        self.eof = True
        if self.linger_until is not None:
            return None  # the client is done too: close
        if self.parsing is not None:
            self.parsing.fail(400, "the client closed the connection inside the request body")
        self._wake()
        return True  # keep the transport open: the answer in progress still goes out

    # ---- httptools callbacks ---------------------------------------------------------------
    def on_message_begin(self) -> None:
        if len(self.queue) >= MAX_PIPELINE:
            # Read-ahead is full: answer what is queued, then close (the client retries the
            # rest, RFC 9112 9.3.2). Raising stops the parser; the rest of this read is dropped.
            last = self.queue[-1]
            if isinstance(last, _Request):
                last.keep_alive = False
            raise _ReadAheadFull
        self.in_head = True
        self._url = b""
        self._headers = []
        self._parsed_head = 0
        self._bad_coding = ""

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._parsed_head += len(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        key, text = name.decode("latin-1"), value.decode("latin-1")
        if key.lower() == "transfer-encoding":
            codings = [c.strip().lower() for c in text.split(",")]
            if codings[-1] != "chunked":
                self._bad_coding = text
        self._headers.append((key, text))
        self._parsed_head += len(name) + len(value) + 4

    def on_headers_complete(self) -> None:
        self.in_head = False
        parser = self.parser
        if self._parsed_head > self.limits.max_head_bytes:
            self.refuse(431, "request head too large")
            raise _ReadAheadFull  # stop parsing: nothing more is read
        if self._bad_coding:
            return  # llhttp refuses the request next (see _parse_error): 501
        method = parser.get_method().decode("ascii", "replace")
        if method == "CONNECT":
            self.refuse(501, "CONNECT is not supported")
            raise _ReadAheadFull
        headers = self._headers
        length: int | None = None
        chunked = False
        for k, v in headers:
            lk = k.lower()
            if lk == "content-length":
                length = int(v)  # llhttp checked: digits only, one value
            elif lk == "transfer-encoding":
                chunked = True
        if length is not None and length > self.limits.max_body_bytes:
            self.refuse(
                413,
                f"the request body ({length} bytes) is over the edge's limit of "
                f"{self.limits.max_body_bytes} bytes",
            )
            raise _ReadAheadFull
        version = parser.get_http_version()
        req = _Request(
            self,
            method,
            self._url.decode("latin-1"),
            version if version in ("1.0", "1.1") else "1.1",
            headers,
            keep_alive=version == "1.1" and parser.should_keep_alive(),
            content_length=length,
            chunked=chunked,
        )
        if not req.has_body:
            req.complete = True
        else:
            self.parsing = req
        self.queue.append(req)
        if len(self.queue) > 1 or self.active is not None:
            self._pause_reading()  # served after the current one: read nothing more until then
        self._wake()

    def on_body(self, body: bytes) -> None:
        req = self.parsing
        if req is None or req.complete or req.failure is not None:
            return
        req.received += len(body)
        if req.received > self.limits.max_body_bytes:
            req.fail(
                413,
                f"the request body is over the edge's limit of {self.limits.max_body_bytes} bytes",
            )
            self.stopped = True
            self._pause_reading()
            return
        req.pieces.append(bytes(body))
        req.buffered += len(body)
        if req.buffered > MAX_UNREAD_BODY:
            self._pause_reading()
        req.wake()

    def on_message_complete(self) -> None:
        req = self.parsing
        self.parsing = None
        if req is not None and req.failure is None:
            req.complete = True
            req.wake()
        self.in_head = True  # the next bytes begin a new head; its clock starts with them
        self.head_bytes = 0
        self.head_t0 = None

    # ---- parse outcomes ----------------------------------------------------------------------
    def _parse_error(self, exc: Exception) -> None:
        self.stopped = True
        if self.parsing is not None:  # inside a body: that request fails
            self.parsing.fail(400, f"malformed request body ({exc})")
            return
        if self._bad_coding:
            self.refuse(
                501,
                f"transfer coding {self._bad_coding!r} is not supported (only chunked)",
            )
        else:
            self.refuse(400, f"malformed request ({exc})")

    def _upgraded(self, rest: bytes) -> None:
        """An upgrade request: what follows its head is the client's raw stream."""
        self.upgraded = True
        req = self.queue[-1] if self.queue else None
        if isinstance(req, _Request):
            req.upgrade = True
            req.keep_alive = False
            req.complete = True
        if rest:
            self.raw.append(rest)
            self.raw_bytes += len(rest)
        self._wake()

    def refuse(self, status: int, text: str) -> None:
        """Queue the answer `status` in place of the next request, then close."""
        if self.closing:
            return
        self.stopped = True
        self.closing = True
        self.edge.lines.warn(
            f"refused-{status}", "edge: %s: %d %s (connection closed)", self.url, status, text
        )
        self.queue.append(_Refusal(status, text))
        self._wake()

    # ---- for the serving coroutine ---------------------------------------------------------
    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def next_request(self) -> _Request | _Refusal | None:
        """The next request (or refusal) in order; None once the client is gone or done."""
        while True:
            if self.queue:
                item = self.queue.popleft()
                if isinstance(item, _Request):
                    self.active = item
                    self.idle_since = None
                return item
            if self.lost or self.stopped or self.closing or self.eof:
                return None
            self._resume_reading()
            self._waiter = self.loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    def request_done(self) -> None:
        self.active = None
        if not self.queue:
            self.idle_since = self.loop.time()

    def body_taken(self, req: _Request) -> None:
        if req.buffered <= MAX_UNREAD_BODY // 2 and req is self.parsing and not self.stopped:
            self._resume_reading()

    def wants_body(self, req: _Request) -> None:
        """The request being answered waits for more of its body: read the client."""
        if req is self.parsing and req.buffered <= MAX_UNREAD_BODY // 2 and not self.stopped:
            self._resume_reading()

    async def raw_chunks(self) -> AsyncIterator[bytes]:
        """The raw bytes after an upgrade, as they arrive, until the client's EOF."""
        while True:
            if self.raw:
                data = self.raw.popleft()
                self.raw_bytes -= len(data)
                if self.raw_bytes <= MAX_UNREAD_BODY // 2:
                    self._resume_reading()
                yield data
                continue
            if self.lost or self.eof:
                return
            self._resume_reading()
            self._waiter = self.loop.create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.lost:
            self.transport.write(data)

    async def drain(self) -> None:
        if self.lost:
            raise _ClientGone
        if self.write_paused:
            self._drain = self.loop.create_future()
            try:
                await self._drain
            finally:
                self._drain = None
            if self.lost:
                raise _ClientGone

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.transport.get_extra_info(name, default) if self.transport else default

    def close_after_answer(self) -> None:
        """Close once what was written has gone out: FIN first, then drop what the client
        still sends until it closes too or LINGER_S passes (the sweep)."""
        self.closing = True
        self.stopped = True
        transport = self.transport
        if transport is None or transport.is_closing() or self.lost:
            return
        if self.upgraded or not transport.can_write_eof():
            transport.close()
            return
        try:
            transport.write_eof()
        except OSError:
            transport.close()
            return
        self.linger_until = self.loop.time() + LINGER_S
        self._resume_reading()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    def prove(self) -> None:
        """A request on this connection passed the endpoint's proxy auth."""
        if not self.proven:
            self.proven = True
            self.edge.unproven.pop(self, None)

    @property
    def idle(self) -> bool:
        """No request is being answered or waits to be (what is in the parser, a partial
        head, may be dropped: the client has had no answer to it)."""
        return self.active is None and not self.queue and not self.upgraded and not self.lost

    def _pause_reading(self) -> None:
        if not self.reading_paused and self.transport is not None and not self.lost:
            self.reading_paused = True
            self.transport.pause_reading()

    def _resume_reading(self) -> None:
        if self.reading_paused and self.transport is not None and not self.lost:
            self.reading_paused = False
            self.transport.resume_reading()

    def sweep(self, now: float) -> None:
        """The head, body and keep-alive clocks (called about once a second)."""
        transport = self.transport
        if transport is None or self.lost:
            return
        if self.linger_until is not None:
            if now > self.linger_until:
                transport.close()
            return
        limits = self.limits
        req = self.parsing
        if req is not None and req.body_overdue(now, limits.body_timeout_s):
            self.stopped = True
            req.fail(
                408, f"the request body did not arrive: {limits.body_timeout_s:g} s waiting for it"
            )
            return
        if self.closing or self.upgraded or self.active is not None or self.queue:
            return
        if self.in_head and self.head_t0 is not None and now - self.head_t0 > limits.head_timeout_s:
            if self.head_bytes:
                self.refuse(
                    408, f"the request head was not complete within {limits.head_timeout_s:g} s"
                )
            else:  # not a byte since the connection opened (or since the last answer)
                self.closing = True
                transport.close()
        elif self.idle_since is not None and now - self.idle_since > limits.keepalive_timeout_s:
            self.closing = True
            transport.close()


def _validated_length(head: Head) -> int | None:
    """A container response's Content-Length: plain digits, one value (else _BadRequest)."""
    values = [v for k, v in head.headers if k.lower() == "content-length"]
    if not values:
        return None
    if len(set(values)) != 1 or not values[0].isdigit():
        raise _BadRequest(f"invalid Content-Length {values!r}")
    return int(values[0])


async def _read_head(reader: asyncio.StreamReader) -> Head | None:
    """A container's response head (the stream's limit bounds its size)."""
    try:
        raw = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if not exc.partial.strip():
            return None
        raise _BadRequest("incomplete response head") from None
    except asyncio.LimitOverrunError:
        raise _BadRequest("response head too large") from None
    lines = raw.decode("latin-1").split("\r\n")
    headers = []
    for line in lines[1:]:
        if not line:
            continue
        k, sep, v = line.partition(":")
        if not sep or not k or k != k.strip():
            raise _BadRequest("malformed header line")
        headers.append((k, v.strip()))
    return Head(lines[0], headers)


def _chunk_size(line: bytes) -> int:
    text = line.split(b";")[0].strip()
    if not text or any(c not in b"0123456789abcdefABCDEF" for c in text) or len(text) > 16:
        raise _BadRequest(f"invalid chunk size {line[:40]!r}")
    return int(text, 16)


async def _copy_response_body(reader: asyncio.StreamReader, writer: Any, head: Head) -> bool:
    """Copy a container's response body as framed (sized or chunked, checked); False when it
    is close-delimited (it ends with the connection)."""
    te = (head.get("transfer-encoding") or "").lower()
    if "chunked" in te:
        while True:
            size_line = await reader.readuntil(b"\r\n")
            writer.write(size_line)
            size = _chunk_size(size_line)
            if size == 0:
                while True:  # trailers, then the blank line
                    line = await reader.readuntil(b"\r\n")
                    writer.write(line)
                    if line == b"\r\n":
                        break
                await writer.drain()
                return True
            remaining = size + 2
            while remaining:
                chunk = await reader.read(min(remaining, 1 << 16))
                if not chunk:
                    raise asyncio.IncompleteReadError(b"", remaining)
                remaining -= len(chunk)
                writer.write(chunk)
            await writer.drain()
    length = _validated_length(head)
    if length is not None:
        remaining = length
        while remaining:
            chunk = await reader.read(min(remaining, 1 << 16))
            if not chunk:
                raise asyncio.IncompleteReadError(b"", remaining)
            remaining -= len(chunk)
            writer.write(chunk)
            if remaining:
                await writer.drain()
        await writer.drain()
        return True
    while True:
        chunk = await reader.read(1 << 16)
        if not chunk:
            return False
        writer.write(chunk)
        await writer.drain()


def _status_of(head: Head) -> int:
    parts = head.first.split(" ", 2)
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 502


def _no_body(method: str, status: int) -> bool:
    return method == "HEAD" or status in (204, 304) or 100 <= status < 200


def _plain(
    status: int, text: str, extra: list[tuple[str, str]] | None = None, close: bool = False
) -> bytes:
    body = (text + "\n").encode()
    head = [
        f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}",
        "content-type: text/plain; charset=utf-8",
        f"content-length: {len(body)}",
    ]
    head += [f"{k}: {v}" for k, v in extra or []]
    if close:
        head.append("connection: close")
    return ("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body


class _Pending:
    """A response that outlived the webhook timeout, read to the end for a later GET."""

    def __init__(self) -> None:
        self.done = asyncio.Event()
        self.data = b""
        self.created = time.monotonic()


class Edge:
    def __init__(
        self,
        runtime: Runtime,
        data_dir: Path,
        host: str = "127.0.0.1",
        limits: EdgeLimits | None = None,
    ) -> None:
        self.runtime = runtime
        self.host = host
        self.limits = limits or EdgeLimits()
        self.public_host = "127.0.0.1" if host in ("0.0.0.0", "") else host
        self._table_path = data_dir / "edge-ports.json"
        self._ports: dict[str, int] = {}
        self._servers: dict[int, asyncio.base_events.Server | None] = {}
        self._idle: dict[str, list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]] = {}
        self._results: dict[str, _Pending] = {}
        self._bg: set[asyncio.Task[Any]] = set()
        self.connections: set[_ClientConnection] = set()
        #: Open connections that have not shown valid credentials yet, oldest first.
        self.unproven: dict[_ClientConnection, None] = {}
        self.lines = _LogLines()
        self._sweeper: asyncio.TimerHandle | None = None
        if self._table_path.exists():
            with contextlib.suppress(ValueError, OSError):
                self._ports = {
                    str(k): int(v) for k, v in json.loads(self._table_path.read_text()).items()
                }

    # ---- ports ------------------------------------------------------------------------
    async def start(self) -> None:
        for label in list(self._ports):
            self._listen(label)
        self._sweep()

    def _sweep(self) -> None:
        now = asyncio.get_running_loop().time()
        for conn in list(self.connections):
            conn.sweep(now)
        interval = min(1.0, self.limits.head_timeout_s / 2)
        self._sweeper = asyncio.get_running_loop().call_later(interval, self._sweep)

    def make_room(self, url: str) -> bool:
        """At the connection cap, close one connection for a new one on `url`: the oldest
        that has not shown valid credentials and is not being answered (a client sending half
        a head, or nothing, or one refused 401); else the longest-idle keep-alive connection
        between two requests. False: every connection is serving a request (the new one is
        refused, as before).

        Why: the cap bounds open files (issue 22 item 5), but when it was first come, first
        served, connections without credentials could hold all of it (issue 32 item 14: 1,024
        half-sent heads, and every authenticated request got a reset until they timed out
        10 s later). nginx makes room the same way when it runs out of `worker_connections`:
        `ngx_drain_connections()` (src/core/ngx_connection.c) closes the oldest "reusable"
        connections, those idle in keep-alive or waiting for a request's first bytes, and
        logs "worker_connections are not enough, reusing connections". Preferring connections
        without credentials over idle authenticated ones, rather than nginx's one queue, is our
        own choice (Modal does not document what its edge does at its limits). A client whose
        keep-alive connection is closed while idle opens a new one (RFC 9112 9.3.1).

        Also our choice: no separate, smaller cap and no shorter head timeout for connections
        without credentials. Every new connection has none until its first head has arrived,
        so such a cap would close the connections of a legitimate burst before they could send
        a byte; closing the oldest only once the whole cap is reached touches them only then.
        The head must still be complete within `head_timeout_s` (10 s; nginx's
        `client_header_timeout` is 60 s by default, Apache's mod_reqtimeout `header=20-40`)."""
        victim: _ClientConnection | None = None
        for conn in self.unproven:  # oldest first
            if conn.idle:
                victim = conn
                why = "that had not sent a request head with valid credentials"
                break
        if victim is None:
            idle = [c for c in self.connections if c.idle and c.idle_since is not None]
            if idle:
                victim = min(idle, key=lambda c: c.idle_since or 0.0)
                why = "idle in keep-alive"
        if victim is None:
            return False
        age = self.loop_time() - (victim.opened_at or 0.0)
        self.lines.warn(
            "connections-evicted",
            "edge: %d client connections are open (the cap): closed the oldest %s (open %.1f s)"
            " for a new one on %s",
            len(self.connections),
            why,
            age,
            url,
        )
        victim.lost = True
        victim.closing = True
        self.connections.discard(victim)
        self.unproven.pop(victim, None)
        victim.abort()
        return True

    @staticmethod
    def loop_time() -> float:
        return asyncio.get_running_loop().time()

    def url_for(self, pattern_url: str) -> str:
        """The edge URL for an endpoint (its Modal-pattern URL names it); binds its port."""
        label = _label(pattern_url)
        port = self._ports.get(label)
        if port is None or port not in self._servers:
            port = self._listen(label)
        return f"http://{self.public_host}:{port}"

    def _listen(self, label: str) -> int:
        wanted = self._ports.get(label, 0)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, wanted))
        except OSError as exc:
            if not wanted:
                sock.close()
                raise
            log.warning(
                "edge: port %d of endpoint %s is taken (%s); the endpoint gets a new port and URL",
                wanted,
                label,
                exc,
            )
            sock.bind((self.host, 0))
        sock.listen(512)
        sock.setblocking(False)
        port = int(sock.getsockname()[1])
        self._ports[label] = port
        self._servers[port] = None
        self._save()
        self.track(asyncio.get_running_loop().create_task(self._serve(port, sock)))
        return port

    def track(self, task: asyncio.Task[Any]) -> None:
        self._bg.add(task)
        task.add_done_callback(self._bg.discard)

    async def _serve(self, port: int, sock: socket.socket) -> None:
        url = f"http://{self.public_host}:{port}"
        loop = asyncio.get_running_loop()
        self._servers[port] = await loop.create_server(
            lambda: _ClientConnection(self, url), sock=sock, backlog=512
        )

    def _save(self) -> None:
        tmp = self._table_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self._ports, indent=1, sort_keys=True))
        tmp.replace(self._table_path)

    async def close(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        for server in self._servers.values():
            if server is not None:
                server.close()
        for conn in list(self.connections):
            conn.abort()
        for conns in self._idle.values():
            for _r, w in conns:
                w.close()
        self._idle.clear()
        for task in list(self._bg):
            task.cancel()

    def forget(self, task_id: str) -> None:
        """A container is gone: close the connections kept alive to it."""
        for _r, w in self._idle.pop(task_id, []):
            w.close()

    def ports(self) -> dict[str, int]:
        return dict(self._ports)

    # ---- requests -------------------------------------------------------------------------
    async def _serve_connection(self, conn: _ClientConnection) -> None:
        """Answer a client connection's requests in order, until it ends or must close."""
        url = conn.url
        try:
            while True:
                item = await conn.next_request()
                if item is None:
                    return
                if isinstance(item, _Refusal):
                    conn.write(_plain(item.status, f"modal-http: {item.text}", close=True))
                    return
                req = item
                try:
                    keep = await self._request(url, req, conn)
                except _BodyFailed as exc:
                    # The body broke before any answer went out (a later failure cuts the
                    # answer instead, in the handlers): say why, then close.
                    self.lines.warn(
                        f"refused-{exc.status}",
                        "edge: %s: %d %s (connection closed)",
                        url,
                        exc.status,
                        exc.text,
                    )
                    conn.write(_plain(exc.status, f"modal-http: {exc.text}", close=True))
                    return
                if not (keep and req.keep_alive and req.complete and not req.upgrade):
                    return
                conn.request_done()
        except (_ClientGone, ConnectionError, asyncio.IncompleteReadError):
            pass
        except Exception as exc:  # a bug: one line (rate-limited), the traceback at DEBUG
            self.lines.warn("internal", "edge: request on %s failed: %r", url, exc)
            log.debug("edge: request on %s failed", url, exc_info=True)
        finally:
            conn.close_after_answer()

    def _authorized(self, pool: Pool, head: Head) -> tuple[bool, str]:
        key, secret = head.get("modal-key"), head.get("modal-secret")
        if not (key and secret):
            auth = head.get("authorization") or ""
            scheme, _, token = auth.partition(" ")
            if scheme.lower() == "bearer" and token.startswith("wk-"):
                for sep in (".", ":"):
                    if sep in token:
                        key, _, secret = token.partition(sep)
                        break
        if not (key and secret):
            return False, "modal-http: missing credentials for proxy authorization"
        if self.runtime.state.tokens.verify(key, secret, pool.env_name):
            return True, ""
        return False, "modal-http: invalid credentials for proxy authorization"

    @staticmethod
    def _answer(
        conn: _ClientConnection,
        req: _Request,
        status: int,
        text: str,
        extra: list[tuple[str, str]] | None = None,
    ) -> bool:
        """An answer of the edge's own; keep-alive only when the whole body was read (an
        unread body is never read just to be dropped: the connection closes instead)."""
        keep = req.complete and req.keep_alive
        conn.write(_plain(status, text, extra, close=not keep))
        return keep

    async def _request(self, url: str, req: _Request, conn: _ClientConnection) -> bool:
        method, target, head = req.method, req.target, req.head
        client_keep = req.keep_alive
        pool = self.runtime.route(url)
        if pool is None:
            keep = self._answer(
                conn, req, 404, "modal-http: app for invoked web endpoint is stopped"
            )
            await conn.drain()
            return keep
        if pool.settings.requires_auth:
            ok, why = self._authorized(pool, head)
            if not ok:
                keep = self._answer(conn, req, 401, why)
                await conn.drain()
                return keep
        conn.prove()  # valid credentials (or none needed): kept over those without at the cap
        split = urllib.parse.urlsplit(target)
        query = urllib.parse.parse_qs(split.query)
        if RESULT_PARAM in query:
            if not req.complete:
                self._answer(conn, req, 400, "modal-http: a result URL takes no request body")
                return False
            return await self._answer_pending(query[RESULT_PARAM][0], target, conn, client_keep)
        if pool.settings.kind != "server":
            return await self._web(url, pool, req, conn)
        try:
            container = await self.runtime.acquire(pool, pool.settings.startup_timeout + 5)
        except NoCapacity as exc:
            keep = self._answer(conn, req, 429, f"modal-http: too many requests: {exc}")
            await conn.drain()
            return keep
        except StartFailed as exc:
            keep = self._answer(conn, req, 503, f"modal-http: the container failed to start: {exc}")
            await conn.drain()
            return keep
        try:
            return await self._forward(pool, container, method, req, conn, client_keep)
        finally:
            self.runtime.release(pool, container)

    async def _web(self, url: str, pool: Pool, req: _Request, conn: _ClientConnection) -> bool:
        """asgi_app / fastapi_endpoint / wsgi_app / web_server: the request is an input.

        As on Modal, the container gets the ASGI scope as a function input (data format ASGI),
        reads the body as `http.request` messages (FunctionCallGetDataIn) and streams
        `http.response.*` messages back (FunctionCallPutDataOut); modal's own wrapper in the
        container turns them into calls of the app (or a proxy to the web_server's port).
        """
        from modal._serialization import deserialize_data_format, serialize, serialize_data_format

        asgi = api_pb2.DATA_FORMAT_ASGI
        head = req.head
        split = urllib.parse.urlsplit(req.target)
        peer = conn.get_extra_info("peername") or ("127.0.0.1", 0)
        drop = {"modal-key", "modal-secret"}
        if (head.get("authorization") or "").lower().startswith("bearer wk-"):
            drop.add("authorization")
        scope = {
            "type": "http",
            "http_version": "1.1",
            "method": req.method,
            "scheme": "http",
            "path": urllib.parse.unquote(split.path or "/"),
            "query_string": split.query.encode(),
            "headers": [
                (k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in head.without(drop)
            ],
            "client": (str(peer[0]), int(peer[1])),
        }
        # The scope travels pickled as the call's one argument, ((scope,), {}): what the
        # container's ASGI wrapper is called with (modal-labs/modal-client test/conftest.py
        # builds web inputs the same way); the messages after it use the ASGI data format.
        item = api_pb2.FunctionInput(
            args=serialize(((scope,), {})), data_format=api_pb2.DATA_FORMAT_PICKLE
        )
        method_name = pool.method_for(url)
        if method_name:
            item.method_name = method_name
        calls = self.runtime.calls
        call = calls.create(pool.function_id)
        calls.add_input(call, 0, item)
        self.runtime.wake()
        failed: list[_BodyFailed] = []

        async def feed() -> None:
            index = 0

            def put(body: bytes, more: bool) -> None:
                nonlocal index
                index += 1
                message = {"type": "http.request", "body": body, "more_body": more}
                call.data_in.append((index, asgi, serialize_data_format(message, asgi)))
                call.notify()

            try:
                async for body in req.chunks():
                    # The container takes the body as it asks for it: read the client no
                    # faster (at most MAX_UNREAD_BODY bytes it has not taken yet).
                    while call.data_in_unread() > MAX_UNREAD_BODY and call.unfinished:
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(call.changed.wait(), 1.0)
                    put(body, True)
                put(b"", False)
            except _BodyFailed as exc:
                failed.append(exc)
                call.notify()
            except _ClientGone:
                call.notify()

        feeder = asyncio.get_running_loop().create_task(feed())
        try:
            return await self._web_response(call, req, conn, deserialize_data_format, failed)
        finally:
            if not feeder.done():
                feeder.cancel()
            calls.forget(call.id)

    async def _web_response(
        self,
        call: Any,
        req: _Request,
        conn: _ClientConnection,
        decode: Any,
        failed: list[_BodyFailed],
    ) -> bool:
        method = req.method
        seen = 0
        chunked = False
        started = False
        status = 200
        deadline = time.monotonic() + self.runtime.options.webhook_timeout
        while True:
            if failed:
                if started:
                    return False  # cut the response: the client sees a truncated body
                raise failed[0]
            if conn.lost:
                return False
            fresh = [c for c in call.data_out if c[0] > seen]
            for index, data_format, data in fresh:
                seen = index
                message = decode(data, data_format, None)
                kind = message.get("type")
                if kind == "http.response.start" and not started:
                    started = True
                    status = int(message.get("status", 200))
                    headers = [
                        (bytes(k).decode("latin-1"), bytes(v).decode("latin-1"))
                        for k, v in message.get("headers", [])
                    ]
                    names = {k.lower() for k, _ in headers}
                    chunked = "content-length" not in names and not _no_body(method, status)
                    if chunked:
                        headers = [(k, v) for k, v in headers if k.lower() != "transfer-encoding"]
                        headers.append(("transfer-encoding", "chunked"))
                    reason = _REASONS.get(status, "OK" if status < 400 else "Error")
                    conn.write(Head(f"HTTP/1.1 {status} {reason}", headers).encode())
                elif kind == "http.response.body" and started:
                    body = bytes(message.get("body", b""))
                    if body and not _no_body(method, status):
                        if chunked:
                            conn.write(f"{len(body):x}\r\n".encode() + body + b"\r\n")
                        else:
                            conn.write(body)
                    if not message.get("more_body", False):
                        if chunked:
                            conn.write(b"0\r\n\r\n")
                        await conn.drain()
                        return req.keep_alive
                await conn.drain()
            if call.unfinished == 0 and not [c for c in call.data_out if c[0] > seen]:
                # the input finished without (completing) a response
                failure = next(
                    (
                        o.item.result
                        for o in call.outputs
                        if o.item.result.status != api_pb2.GenericResult.GENERIC_STATUS_SUCCESS
                    ),
                    None,
                )
                if started:
                    return False  # cut the response: the client sees a truncated body
                why = failure.exception if failure is not None else "no response"
                keep = self._answer(conn, req, 500, f"modal-http: internal error: {why}")
                await conn.drain()
                return keep
            if not started and time.monotonic() > deadline:
                conn.write(
                    _plain(
                        504, "modal-http: the response did not start within the timeout", close=True
                    )
                )
                await conn.drain()
                return False
            changed = call.changed
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), 1.0)

    async def _upstream(
        self, container: Container, port: int
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, bool]:
        """A connection to the container's port: a kept-alive one (reused=True) or a new one."""
        idle = self._idle.get(container.task_id)
        while idle:
            r, w = idle.pop()
            if not w.is_closing() and not r.at_eof():
                return r, w, True
            w.close()
        r, w = await netns.connect(
            container.pid if container.netns else None, port, limit=MAX_UPSTREAM_HEAD
        )
        return r, w, False

    def _park(
        self, container: Container, conn: tuple[asyncio.StreamReader, asyncio.StreamWriter]
    ) -> None:
        if container.state != "ready":
            conn[1].close()
            return
        self._idle.setdefault(container.task_id, []).append(conn)

    @staticmethod
    async def _send_body(req: _Request, up_w: asyncio.StreamWriter) -> None:
        """The request body to the container, framed as the client framed it (chunks are
        re-chunked as they arrive: httptools decodes them; trailers are not forwarded)."""
        if req.chunked:
            async for piece in req.chunks():
                up_w.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                await up_w.drain()
            up_w.write(b"0\r\n\r\n")
        elif req.content_length:
            async for piece in req.chunks():
                up_w.write(piece)
                await up_w.drain()

    async def _forward(
        self,
        pool: Pool,
        container: Container,
        method: str,
        req: _Request,
        conn: _ClientConnection,
        client_keep: bool,
    ) -> bool:
        head = req.head
        drop = {"modal-key", "modal-secret"}
        if (head.get("authorization") or "").lower().startswith("bearer wk-"):
            drop.add("authorization")
        # Hop-by-hop headers are the client's connection's, not the container's (RFC 9110
        # 7.6.1): the edge keeps its own connection to the container alive. Forwarding a
        # client's `Connection: close` made the container close right after answering; an
        # early answer (401/403 before the body was read) then met the body still arriving,
        # the container's kernel reset the connection, and the answer's body was lost
        # (IncompleteRead at the client, ~1 request in 70 under load). An upgrade keeps them.
        connection = {t.strip().lower() for t in (head.get("connection") or "").split(",")}
        if not (req.upgrade and "upgrade" in connection and head.get("upgrade")):
            drop |= _HOP | connection
        headers = head.without(drop)
        bodyless = not req.has_body
        timeout = self.runtime.options.webhook_timeout
        resp: Head | None = None
        up_r: asyncio.StreamReader | None = None
        up_w: asyncio.StreamWriter | None = None
        parked = False
        try:
            for attempt in (0, 1):
                try:
                    up_r, up_w, reused = await self._upstream(container, pool.settings.port)
                except OSError as exc:
                    self.lines.note(
                        "refused-port",
                        logging.INFO,
                        "edge: container %s refused port: %s",
                        container.task_id,
                        exc,
                    )
                    keep = self._answer(
                        conn, req, 502, f"modal-http: the container's port refused: {exc}"
                    )
                    await conn.drain()
                    return keep
                try:
                    try:
                        up_w.write(head.encode(headers))
                        await self._send_body(req, up_w)
                        await up_w.drain()
                    except ConnectionError:
                        pass  # it stopped reading: it may have answered early (read below)
                    resp = await asyncio.wait_for(_read_head(up_r), timeout)
                except TimeoutError:
                    parked = True  # the reader below owns the connection now
                    return await self._detach(up_r, up_w, req, conn, client_keep)
                except (_BadRequest, ConnectionError):
                    resp = None
                if resp is None and reused and bodyless and attempt == 0:
                    up_w.close()  # a kept-alive connection the container had closed: once more
                    continue
                break
            assert up_r is not None and up_w is not None
            while resp is not None and 100 <= _status_of(resp) < 200 and _status_of(resp) != 101:
                conn.write(resp.encode())
                await conn.drain()
                try:
                    resp = await asyncio.wait_for(_read_head(up_r), timeout)
                except (_BadRequest, ConnectionError, TimeoutError):
                    resp = None
            if resp is None:
                self.lines.note(
                    "container-closed",
                    logging.INFO,
                    "edge: container %s closed the connection or sent a malformed head",
                    container.task_id,
                )
                keep = self._answer(
                    conn, req, 502, "modal-http: the container closed the connection"
                )
                await conn.drain()
                return keep
            status = _status_of(resp)
            if status == 101:
                if not req.upgrade:
                    keep = self._answer(
                        conn, req, 502, "modal-http: the container switched protocols unasked"
                    )
                    await conn.drain()
                    return False
                conn.write(resp.encode())
                await conn.drain()
                await self._pipe(conn, up_r, up_w)
                return False
            conn.write(resp.encode())
            framed = True
            if not _no_body(method, status):
                try:
                    framed = await _copy_response_body(up_r, conn, resp)
                except (_BadRequest, asyncio.IncompleteReadError, ConnectionError) as exc:
                    self.lines.note(
                        "container-body",
                        logging.INFO,
                        "edge: container %s broke its response: %s",
                        container.task_id,
                        exc,
                    )
                    return False  # cut: the client sees a truncated response
            await conn.drain()
            if framed and (resp.get("connection") or "").lower() != "close":
                self._park(container, (up_r, up_w))
                parked = True
            return client_keep and framed
        finally:
            if up_w is not None and not parked:
                up_w.close()

    async def _pipe(
        self,
        conn: _ClientConnection,
        up_r: asyncio.StreamReader,
        up_w: asyncio.StreamWriter,
    ) -> None:
        """An upgraded connection: bytes both ways until either side ends."""

        async def to_container() -> None:
            with contextlib.suppress(ConnectionError, OSError):
                async for data in conn.raw_chunks():
                    up_w.write(data)
                    await up_w.drain()
                if up_w.can_write_eof():
                    up_w.write_eof()

        async def to_client() -> None:
            with contextlib.suppress(ConnectionError, OSError, _ClientGone):
                while data := await up_r.read(1 << 16):
                    conn.write(data)
                    await conn.drain()

        up = asyncio.get_running_loop().create_task(to_container())
        try:
            await to_client()
        finally:
            up.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await up

    async def _detach(
        self,
        up_r: asyncio.StreamReader,
        up_w: asyncio.StreamWriter,
        req: _Request,
        conn: _ClientConnection,
        client_keep: bool,
    ) -> bool:
        """The response did not start in time: keep reading it in the background, answer 303."""
        call_id = new_id("function_call")
        pending = _Pending()
        self._results[call_id] = pending
        method = req.method

        async def finish() -> None:
            try:
                resp = await _read_head(up_r)
                if resp is None:
                    pending.data = _plain(502, "modal-http: the container closed the connection")
                    return
                sink = _Buffer()
                if not _no_body(method, _status_of(resp)):
                    await _copy_response_body(up_r, sink, resp)
                if "chunked" in (resp.get("transfer-encoding") or "").lower():
                    headers = resp.without({"connection"})  # chunk framing kept as read
                else:
                    headers = resp.without({"content-length", "connection"})
                    headers.append(("content-length", str(len(sink.data))))
                pending.data = resp.encode(headers) + bytes(sink.data)
            except Exception as exc:
                pending.data = _plain(502, f"modal-http: reading the response failed: {exc}")
            finally:
                up_w.close()
                pending.done.set()

        self.track(asyncio.get_running_loop().create_task(finish()))
        keep = self._answer(
            conn,
            req,
            303,
            "modal-http: the result will be at Location",
            extra=[("location", _with_param(req.target, call_id))],
        )
        await conn.drain()
        return keep and client_keep

    async def _answer_pending(
        self, call_id: str, target: str, conn: _ClientConnection, client_keep: bool
    ) -> bool:
        pending = self._results.get(call_id)
        if pending is None:
            conn.write(_plain(404, f"modal-http: no pending result {call_id}"))
            await conn.drain()
            return client_keep
        try:
            await asyncio.wait_for(pending.done.wait(), self.runtime.options.webhook_timeout)
        except TimeoutError:
            conn.write(_plain(303, "modal-http: still running", [("location", target)]))
            await conn.drain()
            return client_keep
        self._results.pop(call_id, None)
        conn.write(pending.data)
        await conn.drain()
        return client_keep


class _Buffer:
    """A writer stand-in that collects bytes (for responses answered after a 303)."""

    def __init__(self) -> None:
        self.data = bytearray()

    def write(self, data: bytes) -> None:
        self.data += data

    async def drain(self) -> None:
        return None


def _with_param(target: str, call_id: str) -> str:
    split = urllib.parse.urlsplit(target)
    query = urllib.parse.parse_qsl(split.query, keep_blank_values=True)
    query = [(k, v) for k, v in query if k != RESULT_PARAM] + [(RESULT_PARAM, call_id)]
    return urllib.parse.urlunsplit(("", "", split.path or "/", urllib.parse.urlencode(query), ""))
