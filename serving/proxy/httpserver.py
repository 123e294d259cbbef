"""The proxy's own HTTP/1.1 server: one asyncio protocol on httptools.

It serves the proxy app from callbacks: a request is handed to ``app.serve_now(req)`` in the
read callback that completed it (or ``app.serve_head(req)`` when its body is still arriving),
and the app answers through the request object's ``relay.ClientWriter`` methods (``respond``,
``start_stream``, ``write_piece``, ``end_stream``, ``when_drained``, ``fail``): no coroutine,
task or future per request. Any other ASGI app (and the proxy app for a chunked request body)
is served through ASGI ``receive``/``send`` in a task.

Why not uvicorn (kept as ``--server uvicorn``, see ``server.py``): per request uvicorn builds an
``asyncio.Event``, a flow-control object and a cycle object, checks every header with a regex,
runs the app in a task and writes a non-stream response in two syscalls (head, then body).
Here a non-stream response goes out in one write, a streamed chunk in one write, there are no
per-request timers, and the head limits uvicorn lacks are built in (issue 13 and issue 14
item 8; figures in docs/proxy.md). What it owns, and how:

- Parsing: ``httptools`` (llhttp), as uvicorn's default stack: it refuses bad framing
  (``Content-Length`` + ``Transfer-Encoding``, bad chunk sizes), bare CR/LF, NUL and folded
  header lines with ``400`` + close. Absolute-form targets are reduced to their path.
- Keep-alive: HTTP/1.1 unless the client says ``Connection: close``; HTTP/1.0 closes after the
  response. An idle keep-alive connection is closed after ``keepalive_timeout_s`` (75 s).
- Pipelining: requests parsed while one is served are queued and served in order (the next on
  the loop turn after the previous answer); reading is paused while any are queued. The next
  one is served only once the client has taken the previous answer (the socket's buffer is
  below its high-water mark): a client that pipelines and never reads gets nothing more
  served, nothing more read (issue 22 item 1). At most ``MAX_PIPELINE`` requests are read
  ahead of the one being served; past that the queued ones are answered and the connection
  closes (the client retries the rest, RFC 9112 9.3.2).
- ``Expect: 100-continue``: ``100 Continue`` is sent when the app asks for the body
  (``await_body``, or the first ``receive()``: the proxy asks only after the key check), never
  to a client the app answers without reading.
- Head limits: ``max_head_bytes`` (431) and ``head_timeout_s`` (408), as ``server.py`` does for
  uvicorn. A request body is held in memory until the app takes it; reading from the socket is
  paused while more than 1 MiB waits unread, so a client cannot pile up unread bodies (not for
  a body the app awaits with ``await_body``: it charges each piece to its budget as it arrives,
  ``on_body_piece``). A large body the app awaits can be collected in one anonymous mapping
  (``collect``): its memory is the bytes that arrived, contiguous (no join copy), and goes
  back to the system as soon as the body is dropped.
- Responses: the app's headers as given (the proxy's own, or engine headers its upstream
  client validated), plus ``date``; ``transfer-encoding: chunked`` when the app gives no
  ``Content-Length`` (HTTP/1.1) or close-delimited (HTTP/1.0); no body for HEAD, 204, 304.
- Write back-pressure: when the socket's buffer is over its high-water mark, ``write_piece``
  returns True and ``when_drained`` calls back once it is below (ASGI: ``send`` waits);
  ``when_flushed`` calls back then or when the connection is gone (the app keeps an answer's
  bytes in its buffer budget until then).
- Disconnects: the request's ``on_disconnect`` (set by the app) is called once when the
  connection is lost; writes become no-ops. ASGI: ``receive()`` returns ``http.disconnect``
  once the client is gone (or, after the whole body was read, once the response is complete).
- Errors in the app: ``500`` + close if no response head went out yet, else the connection is
  closed (the client sees a cut response, never a silent success).
- Shutdown: stop accepting, close idle connections, let requests in progress finish for up to
  ``graceful_s`` seconds (their connections close after the response), then cancel and close
  what is left, then run the app's shutdown.

One sweep per server (every min(1 s, ``head_timeout_s`` / 2)) enforces the head timeout and the
keep-alive timeout and refreshes the cached ``date`` header.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import http
import logging
import mmap
import socket
import time
import urllib.parse
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from email.utils import formatdate
from typing import Any

import httptools

__all__ = ["HttpServer", "ServerLimits"]

log = logging.getLogger("serving.proxy")

Message = MutableMapping[str, Any]
App = Callable[
    [
        MutableMapping[str, Any],
        Callable[[], Awaitable[Message]],
        Callable[[Message], Awaitable[None]],
    ],
    Awaitable[None],
]

_STATUS_LINES = {
    s.value: b"HTTP/1.1 %d %s\r\n" % (s.value, s.phrase.encode()) for s in http.HTTPStatus
}
_NO_BODY_STATUS = frozenset({204, 304})
_DISCONNECT: Message = {"type": "http.disconnect"}
_MAX_UNREAD_BODY = 1024 * 1024  # pause reading the socket above this many unread body bytes
# Requests parsed ahead of the one being served, at most (their heads and bodies are held).
MAX_PIPELINE = 16
# An answer's body from this size goes out in one writev with its head (no join copy).
_GATHER_FROM = 16 * 1024
# A connection closed after its answer first sends FIN and reads (dropping) what the client
# still sends, for at most this long: closing with unread bytes makes the kernel answer RST,
# which can destroy the answer before the client read it (nginx's lingering_close, 5 s).
LINGER_S = 2.0
_CONTINUE = b"HTTP/1.1 100 Continue\r\n\r\n"
_ERROR_TEXT = {
    400: b"Invalid HTTP request received.",
    408: b"Request Timeout: the request head was not complete in time",
    431: b"Request Header Fields Too Large",
    500: b"Internal Server Error",
}


def _plain_response(status: int) -> bytes:
    body = _ERROR_TEXT[status]
    return (
        _STATUS_LINES[status] + b"content-type: text/plain; charset=utf-8\r\ncontent-length: %d\r\n"
        b"connection: close\r\n\r\n%s" % (len(body), body)
    )


@dataclass(frozen=True, slots=True)
class ServerLimits:
    max_head_bytes: int = 32 * 1024
    head_timeout_s: float = 10.0
    keepalive_timeout_s: float = 75.0
    graceful_s: float = 30.0


class _Request:
    """One request: its head, its body as it arrives, and the two ways to answer it: the
    ``relay.ClientWriter`` methods (``respond``, ``start_stream``, ``write_piece``,
    ``end_stream``, ``when_drained``, ``fail``: the proxy app's, no message dicts) and the ASGI
    ``receive``/``send`` pair (any ASGI app; the scope is built only for it)."""

    __slots__ = (
        "_body",
        "_delivered",
        "_filled",
        "_pending_head",
        "_sink",
        "_waiter",
        "buffered",
        "chunked",
        "complete",
        "disconnected",
        "expect_continue",
        "head_request",
        "headers",
        "http_version",
        "keep_alive",
        "method",
        "more_body",
        "no_body",
        "on_body_complete",
        "on_body_piece",
        "on_disconnect",
        "proto",
        "query",
        "raw_path",
        "started",
    )

    def __init__(
        self,
        proto: _HttpProtocol,
        method: str,
        raw_path: bytes,
        query: bytes,
        headers: list[tuple[bytes, bytes]],
        http_version: str,
        keep_alive: bool,
        expect_continue: bool,
    ) -> None:
        self.proto = proto
        self.method = method
        self.raw_path = raw_path
        self.query = query
        self.headers = headers
        self.http_version = http_version
        self.keep_alive = keep_alive
        self.expect_continue = expect_continue
        self.head_request = method == "HEAD"
        self._body: list[bytes] = []
        self._sink: mmap.mmap | None = None  # the body's mapping, when ``collect`` made one
        self._filled = 0
        self.buffered = 0
        self.more_body = True  # the client has more body bytes to send
        self._delivered = False  # the app received the last body message
        self._waiter: asyncio.Future[None] | None = None
        self._pending_head: bytes | None = None
        self.started = False
        self.complete = False
        self.disconnected = False
        self.chunked = False
        self.no_body = False
        # Set by the app: called once when the client's connection is lost, so no task has to
        # wait in receive().
        self.on_disconnect: Callable[[], None] | None = None
        # Set by ``await_body``: called once the whole body is here.
        self.on_body_complete: Callable[[], None] | None = None
        # Set by the app for a body it awaits: called with the size of each piece as it
        # arrives (the app charges it to its buffer budget, and may answer at once).
        self.on_body_piece: Callable[[int], None] | None = None

    def scope(self) -> dict[str, Any]:
        proto = self.proto
        raw_path = self.raw_path
        path = raw_path.decode("ascii")
        if "%" in path:
            path = urllib.parse.unquote(path)
        return {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": self.http_version,
            "method": self.method,
            "scheme": "http",
            "path": path,
            "raw_path": raw_path,
            "query_string": self.query,
            "root_path": "",
            "headers": self.headers,
            "client": proto.client,
            "server": proto.server_addr,
            # The app may use this object directly (its ClientWriter methods, on_disconnect).
            "extensions": {"serving.proxy.request": self},
        }

    def wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def body_arrived(self, data: bytes) -> None:
        sink = self._sink
        if sink is None:
            self._body.append(data)
        else:
            end = self._filled + len(data)
            sink[self._filled : end] = data
            self._filled = end
        self.buffered += len(data)
        charge = self.on_body_piece
        if charge is not None:
            charge(len(data))
        self.wake()

    def collect(self, size: int) -> None:
        """Collect the rest of a ``size``-byte body (its Content-Length: the parser delivers
        exactly that) in one anonymous mapping: pages are backed only as bytes arrive, the body
        is contiguous when complete (no join copy of its pieces), and the memory goes back to
        the system when the last reference to the body is dropped (a join of many pieces left
        the freed pieces in the heap: 64 slow 4 MiB bodies took a proxy to 518 MB, issue 22
        item 4)."""
        if self._sink is not None or size <= 0:
            return
        sink = mmap.mmap(-1, size)
        filled = 0
        for piece in self._body:
            sink[filled : filled + len(piece)] = piece
            filled += len(piece)
        self._body.clear()
        self._sink = sink
        self._filled = filled

    def take_body(self) -> bytes | memoryview:
        """The whole body, once it has all arrived (``more_body`` is False)."""
        sink = self._sink
        data: bytes | memoryview
        if sink is not None:
            self._sink = None
            data = memoryview(sink)[: self._filled]
        else:
            body = self._body
            data = body[0] if len(body) == 1 else b"".join(body)
            body.clear()
        self.buffered = 0
        self._delivered = True
        self.proto.body_consumed()
        return data

    def await_body(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` (from the read callback) once the whole body has arrived; send
        ``100 Continue`` now if the client waits for it. The body is not limited to 1 MiB
        unread here: the caller has reserved its announced size."""
        self.on_body_complete = callback
        if self.expect_continue:
            self.expect_continue = False
            if not self.started:
                self.proto.write(_CONTINUE)
        if not self.more_body:
            self.proto.loop.call_soon(self.body_complete)

    def body_complete(self) -> None:
        callback = self.on_body_complete
        if callback is not None and not self.disconnected and not self.complete:
            self.on_body_complete = None
            callback()

    # -- ASGI receive ----------------------------------------------------------------------
    async def receive(self) -> Message:
        while True:
            if self.disconnected or self.complete:
                return _DISCONNECT
            if not self._delivered and (self._body or not self.more_body):
                more = self.more_body
                data = self.take_body()
                self._delivered = not more
                return {"type": "http.request", "body": bytes(data), "more_body": more}
            if self.expect_continue:
                self.expect_continue = False
                if not self.started:
                    self.proto.write(_CONTINUE)
            waiter = self.proto.loop.create_future()
            self._waiter = waiter
            try:
                await waiter
            finally:
                self._waiter = None

    # -- ASGI send -------------------------------------------------------------------------
    async def send(self, message: Message) -> None:
        if self.disconnected:
            return
        if not self.started:
            if message["type"] != "http.response.start":
                raise RuntimeError(f"expected http.response.start, got {message['type']!r}")
            self.start_stream(message["status"], message.get("headers", ()))
        else:
            if self.complete:
                raise RuntimeError("response already complete")
            if message["type"] != "http.response.body":
                raise RuntimeError(f"expected http.response.body, got {message['type']!r}")
            body: bytes = message.get("body", b"")
            if message.get("more_body", False):
                if body:
                    self.write_piece(body)
            else:
                self.end_stream(body)
                return
        if self.proto.write_paused:
            await self.proto.drain()

    # -- relay.ClientWriter ------------------------------------------------------------------
    def respond(self, status: int, headers: Any, body: bytes) -> bool:
        """A whole response (``headers`` carry its content-length): one write. True: the
        socket's buffer is over its high-water mark (``when_flushed`` says when it is not)."""
        if self.disconnected:
            return False
        self.started = True
        head, _ = self._head(status, headers)
        if self.no_body or not body:
            self.proto.write(head)
        elif len(body) < _GATHER_FROM:
            self.proto.write(head + body)
        else:  # one writev, no copy of a large body
            self.proto.write_two(head, body)
        self._completed()
        return self.proto.write_paused

    def start_stream(self, status: int, headers: Any) -> None:
        if self.disconnected:
            return
        self.started = True
        head, length = self._head(status, headers)
        if self.no_body or length == b"0":
            self.proto.write(head)
            return
        # The body follows at once (Content-Length), or a streamed body's first piece may
        # already be here: hold the head until the next body message, but no longer than the
        # end of this event-loop iteration (a stream whose engine is still silent gets its head
        # without waiting for the first event).
        self._pending_head = head
        if length is None:
            self.proto.loop.call_soon(self._flush_head)

    def write_piece(self, body: bytes) -> bool:
        """A non-final, non-empty body piece of a started response; True when the socket's
        buffer is full (stop producing until ``when_drained``)."""
        if self.disconnected:
            return False
        if self.chunked:
            out = b"%x\r\n%b\r\n" % (len(body), body)
        elif self.no_body:
            out = b""
        else:  # Content-Length, or HTTP/1.0 close-delimited
            out = body
        head = self._pending_head
        if head is not None:
            self._pending_head = None
            out = head + out
        proto = self.proto
        if out:
            proto.write(out)
        return proto.write_paused

    def end_stream(self, body: bytes) -> None:
        if self.disconnected:
            return
        if self.no_body:
            out = b""
        elif self.chunked:
            out = b"%x\r\n%b\r\n0\r\n\r\n" % (len(body), body) if body else b"0\r\n\r\n"
        else:
            out = body
        head = self._pending_head
        if head is not None:
            self._pending_head = None
            out = head + out
        if out:
            self.proto.write(out)
        self._completed()

    def when_drained(self, callback: Callable[[], None]) -> None:
        self.proto.when_drained(callback)

    def when_flushed(self, callback: Callable[[], None]) -> None:
        """``callback()`` once the socket's buffer is below its low-water mark or the
        connection is gone, whichever comes first (now, if it is below already)."""
        self.proto.after_flush(callback)

    def fail(self) -> None:
        if not self.complete:  # a bug after a complete answer leaves the answer alone
            self.proto._abandon(self)

    async def drain(self) -> None:
        await self.proto.drain()

    def _completed(self) -> None:
        self.complete = True
        self.wake()
        self.proto.response_done(self)

    def _head(self, status: int, headers: Any) -> tuple[bytes, bytes | None]:
        """The response head, and its Content-Length if it has one."""
        out = [_STATUS_LINES.get(status) or b"HTTP/1.1 %d \r\n" % status, self.proto.server.date]
        length: bytes | None = None
        for name, value in headers:
            if name == b"content-length":
                length = value
                continue  # added once below
            elif name == b"connection" and value.lower() == b"close":
                self.keep_alive = False
                continue  # added once below
            out += (name, b": ", value, b"\r\n")
        if length is not None:
            out += (b"content-length: ", length, b"\r\n")
        self.no_body = self.head_request or status in _NO_BODY_STATUS or status < 200
        if length is None and not self.no_body:
            if self.http_version == "1.1":
                self.chunked = True
                out.append(b"transfer-encoding: chunked\r\n")
            else:
                self.keep_alive = False  # HTTP/1.0: the body ends when the connection does
        if not self.keep_alive:
            out.append(b"connection: close\r\n")
        out.append(b"\r\n")
        return b"".join(out), length

    def _flush_head(self) -> None:
        head = self._pending_head
        if head is not None and not self.disconnected:
            self._pending_head = None
            self.proto.write(head)


class _HttpProtocol(asyncio.Protocol):
    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.loop = server.loop
        self.app = server.app
        self.limits = server.limits
        self.parser = httptools.HttpRequestParser(self)
        with contextlib.suppress(AttributeError):  # answer the first of pipelined requests
            self.parser.set_dangerous_leniencies(lenient_data_after_close=True)
        self.transport: asyncio.Transport | None = None
        self.client: tuple[str, int] | None = None
        self.server_addr: tuple[str, int] | None = None
        self.active: _Request | None = None  # the request being served
        self.parsing: _Request | None = None  # the request whose body is arriving
        self.pipeline: collections.deque[_Request] = collections.deque()
        self.write_paused = False
        self._drain: asyncio.Future[None] | None = None
        self._on_drained: list[Callable[[], None]] = []
        self._on_flushed: list[Callable[[], None]] = []  # on drain or on connection loss
        self.reading_paused = False
        self.closing = False
        self.read_ahead_full = False  # MAX_PIPELINE reached: the rest of the input is dropped
        self.linger_until: float | None = None  # half-closed: dropping input until then
        self._to_start: _Request | None = None  # made active; its app starts after the read
        self._body_done: _Request | None = None  # its body completed in this read
        # head parsing
        self._url = b""
        self._headers: list[tuple[bytes, bytes]] = []
        self._expect_continue = False
        self.in_head = True
        self.head_bytes = 0
        self._parsed_head = 0
        self.head_t0: float | None = None
        self.idle_since: float | None = None

    # -- asyncio.Protocol ------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.head_t0 = self.loop.time()
        self.server.connections.add(self)
        peer = transport.get_extra_info("peername")
        self.client = (peer[0], peer[1]) if isinstance(peer, tuple) else None
        sockname = transport.get_extra_info("sockname")
        self.server_addr = (sockname[0], sockname[1]) if isinstance(sockname, tuple) else None

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self.server.connections.discard(self)
        for req in (self.active, self.parsing, *self.pipeline):
            if req is not None and not req.disconnected:
                req.disconnected = True
                req.wake()
                callback = req.on_disconnect
                if callback is not None:
                    req.on_disconnect = None
                    callback()
        self.pipeline.clear()
        self._on_drained.clear()
        drain = self._drain
        if drain is not None and not drain.done():
            drain.set_result(None)
        self._flushed()

    def data_received(self, data: bytes) -> None:
        if self.closing or self.read_ahead_full:
            return
        if self.in_head:
            if self.head_t0 is None:
                self.head_t0 = self.loop.time()
            self.head_bytes += len(data)
            self.idle_since = None
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._start_pending()
            # An Upgrade request (h2c, websocket): served as a plain request, then the
            # connection closes; what follows the upgrade point is not parsed.
            for req in (self.active, *self.pipeline):
                if req is not None:
                    req.keep_alive = False
            self.closing = True
            if self.active is None:
                self.transport.close()  # type: ignore[union-attr]
            return
        except httptools.HttpParserError:
            if self.read_ahead_full:  # the parse was stopped on purpose: see on_message_begin
                self._start_pending()
                return
            self.refuse(400)
            self._start_pending()
            return
        if self.in_head and self.head_bytes > self.limits.max_head_bytes and not self.closing:
            self.refuse(431)
        self._start_pending()

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        drain = self._drain
        if drain is not None and not drain.done():
            drain.set_result(None)
        callbacks = self._on_drained
        if callbacks:
            self._on_drained = []
            for callback in callbacks:
                callback()
        self._flushed()

    def _flushed(self) -> None:
        callbacks = self._on_flushed
        if callbacks:
            self._on_flushed = []
            for callback in callbacks:
                callback()

    # -- httptools callbacks ---------------------------------------------------------------
    def on_message_begin(self) -> None:
        if self.active is not None and len(self.pipeline) >= MAX_PIPELINE:
            # Read-ahead is full: answer what is queued, then close (the client retries the
            # rest). Raising stops the parser here; what follows in this read is dropped.
            self.read_ahead_full = True
            self.pipeline[-1].keep_alive = False
            raise _ReadAheadFull
        self._url = b""
        self._headers = []
        self._expect_continue = False
        self._parsed_head = 0

    def on_url(self, url: bytes) -> None:
        self._url += url
        self._parsed_head += len(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"expect" and value.lower() == b"100-continue":
            self._expect_continue = True
        self._headers.append((name, value))
        self._parsed_head += len(name) + len(value) + 4

    def on_headers_complete(self) -> None:
        self.in_head = False
        if self._parsed_head > self.limits.max_head_bytes:
            self.refuse(431)
            return
        parser = self.parser
        method = parser.get_method().decode("ascii")
        version = parser.get_http_version()
        parsed = httptools.parse_url(self._url)
        # httptools' stub types URL.query as bytes, but it is None when the URL has none: read
        # untyped, so that a build compiled with mypyc does not check it against the stub
        # (getattr, a builtin, rather than a typing.cast call per request).
        query: bytes | None = getattr(parsed, "query")  # noqa: B009
        req = _Request(
            self, method, parsed.path, query or b"", self._headers,
            version if version in ("1.0", "1.1") else "1.1",
            keep_alive=version == "1.1" and parser.should_keep_alive(),
            expect_continue=self._expect_continue,
        )  # fmt: skip
        self.parsing = req
        if self.active is None:
            # Served once this read is parsed: a request that came whole in one read (the usual
            # case) then runs its app at once, in this callback (see _start).
            self.active = req
            self.idle_since = None
            self._to_start = req
        else:  # pipelined: served after the current one; stop reading until then
            self.pipeline.append(req)
            self._pause_reading()

    def on_body(self, body: bytes) -> None:
        req = self.parsing
        if req is None or req.complete or req.disconnected:
            return  # the app answered without reading: the body is dropped
        req.body_arrived(body)
        if req.buffered > _MAX_UNREAD_BODY and req.on_body_complete is None and not req.complete:
            self._pause_reading()

    def on_message_complete(self) -> None:
        req = self.parsing
        self.parsing = None
        if req is not None:
            req.more_body = False
            req.wake()
            if req.on_body_complete is not None:
                self._body_done = req  # served once this read is parsed
        self.in_head = True  # the next bytes begin a new head; its clock starts with them
        self.head_bytes = 0
        self.head_t0 = None

    # -- serving ---------------------------------------------------------------------------
    def _serve_next(self) -> None:
        """Serve the first pipelined request (the one before it is complete)."""
        if self.active is not None or not self.pipeline or self.closing:
            return
        req = self.pipeline.popleft()
        if not self.pipeline:
            self._resume_reading()
        self.active = req
        self.idle_since = None
        self._start(req)

    def _start_pending(self) -> None:
        req = self._body_done
        if req is not None:
            self._body_done = None
            req.body_complete()
        req = self._to_start
        if req is not None:
            self._to_start = None
            self._start(req)

    def _start(self, req: _Request) -> None:
        """Serve ``req``. Its body all here and the app has ``serve_now`` (the proxy's): right
        now, in this callback, with no coroutine (the proxy answers it or sends it to the
        engine at once). Else (a body still arriving, or any other ASGI app) a task runs the
        ASGI app."""
        server = self.server
        if server.serve_now is not None:
            try:
                if not req.more_body:
                    server.serve_now(req)
                    return
                if server.serve_head(req):
                    return
            except Exception as exc:  # the app handles its own failures; this is a guard
                log.error("exception in the proxy app", exc_info=exc)
                self._abandon(req)
                return
        task = self.loop.create_task(self._run(req))
        tasks = self.server.tasks
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    async def _run(self, req: _Request) -> None:
        try:
            await self.app(req.scope(), req.receive, req.send)
        except BaseException as exc:
            if not isinstance(exc, asyncio.CancelledError):
                log.error("exception in the proxy app", exc_info=exc)
            self._abandon(req)
        else:
            if not req.complete and not req.disconnected:
                log.error("the proxy app returned without completing its response")
                self._abandon(req)

    def _abandon(self, req: _Request) -> None:
        """The app failed: 500 if nothing was sent yet, else cut the connection."""
        if req.disconnected or self.transport is None:
            return
        if not req.started and self.linger_until is None:
            self.transport.write(_plain_response(500))
            self.close_after_answer()
            return
        self.closing = True
        self.transport.close()

    def write(self, data: bytes) -> None:
        transport = self.transport
        if transport is not None and not transport.is_closing() and self.linger_until is None:
            transport.write(data)

    def write_two(self, head: bytes, body: bytes) -> None:
        transport = self.transport
        if transport is not None and not transport.is_closing() and self.linger_until is None:
            transport.writelines((head, body))

    def when_drained(self, callback: Callable[[], None]) -> None:
        """``callback()`` once the socket's buffer is below its low-water mark (now, if it is)."""
        if self.write_paused and self.transport is not None and not self.transport.is_closing():
            self._on_drained.append(callback)
        else:
            self.loop.call_soon(callback)

    def after_flush(self, callback: Callable[[], None]) -> None:
        """``callback()`` once the socket's buffer is below its low-water mark, or when the
        connection is lost; at once if neither is pending."""
        transport = self.transport
        if self.write_paused and transport is not None and not transport.is_closing():
            self._on_flushed.append(callback)
        else:
            callback()

    async def drain(self) -> None:
        if not self.write_paused or self.transport is None or self.transport.is_closing():
            return
        drain = self._drain
        if drain is None or drain.done():
            drain = self._drain = self.loop.create_future()
        await drain

    def body_consumed(self) -> None:
        if self.reading_paused and not self.pipeline:
            self.reading_paused = False
            if self.transport is not None:
                self.transport.resume_reading()

    def close_after_answer(self) -> None:
        """Close once what was written has gone out, without an RST that could destroy it.

        FIN first (write_eof: queued data is sent before it), then whatever the client still
        sends (a body the answer did not wait for) is read and dropped until the client
        closes too (asyncio.Protocol's eof_received closes the transport) or LINGER_S passes
        (the sweeper)."""
        self.closing = True
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        if not transport.can_write_eof():
            transport.close()
            return
        try:
            transport.write_eof()
        except OSError:
            transport.close()
            return
        self.linger_until = self.loop.time() + LINGER_S
        if self.reading_paused:
            self.reading_paused = False
            transport.resume_reading()

    def response_done(self, req: _Request) -> None:
        self.active = None
        transport = self.transport
        if transport is None:
            return
        if not req.keep_alive or self.closing:
            self.close_after_answer()
            return
        if self.write_paused:
            # The client has not taken this answer yet: serve and read nothing more until it
            # does (a client that pipelines and never reads made the proxy buffer answers
            # without bound, issue 22 item 1). The keep-alive timeout ends a connection that
            # stays this way (``sweep``).
            self.idle_since = self.loop.time()
            self._pause_reading()
            self._on_drained.append(self._after_answer)
            return
        if self.pipeline:  # _after_answer inlined: once per request
            self.loop.call_soon(self._serve_next)
            return
        self.idle_since = self.loop.time()
        self._resume_reading()

    def _after_answer(self) -> None:
        """The answer is out and the client keeps up: the next pipelined request, or read."""
        if self.active is not None or self.closing or self.transport is None:
            return
        if self.pipeline:
            # On the next loop turn, not from inside this answer's callbacks: a long pipeline
            # served at once would nest one call chain per request.
            self.loop.call_soon(self._serve_next)
            return
        self.idle_since = self.loop.time()
        self._resume_reading()

    def _pause_reading(self) -> None:
        if not self.reading_paused and self.transport is not None:
            self.reading_paused = True
            self.transport.pause_reading()

    def _resume_reading(self) -> None:
        if self.reading_paused and self.transport is not None:
            self.reading_paused = False
            self.transport.resume_reading()

    # -- limits and shutdown ---------------------------------------------------------------
    def refuse(self, status: int) -> None:
        """Answer ``status`` (400/408/431) and close; only close if a response is under way
        (another status line inside it would corrupt what the client reads)."""
        self.closing = True
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        active = self.active
        if active is None or not active.started:
            transport.write(_plain_response(status))
            self.close_after_answer()
        else:
            transport.close()  # cut inside a response: the client must see it cut

    def sweep(self, now: float) -> None:
        if self.linger_until is not None and now > self.linger_until:
            self.linger_until = None
            if self.transport is not None:
                self.transport.close()
            return
        if self.closing or self.active is not None:
            return
        limits = self.limits
        if self.in_head and self.head_t0 is not None:
            if now - self.head_t0 > limits.head_timeout_s:
                if self.head_bytes:
                    self.refuse(408)
                else:  # not a byte since the connection opened: nothing to answer
                    self.closing = True
                    self.transport.close()  # type: ignore[union-attr]
        elif self.idle_since is not None and now - self.idle_since > limits.keepalive_timeout_s:
            self.closing = True
            if self.write_paused:  # a client that reads nothing: drop what waits for it
                self.transport.abort()  # type: ignore[union-attr]
            else:
                self.transport.close()  # type: ignore[union-attr]

    def shutdown(self) -> None:
        if self.active is None:
            self.closing = True
            if self.transport is not None:
                self.transport.close()
        else:
            self.active.keep_alive = False
            for req in self.pipeline:
                req.keep_alive = False


class _ReadAheadFull(Exception):
    """Raised from a parser callback to stop parsing: ``MAX_PIPELINE`` requests are queued."""


def _no_head(req: _Request) -> bool:
    return False


class HttpServer:
    """Serves ``app`` (the ASGI ``ProxyApp``; ``startup``/``shutdown`` are called directly)."""

    def __init__(self, app: Any, limits: ServerLimits | None = None) -> None:
        self.app = app
        self.limits = limits or ServerLimits()
        self.loop = asyncio.get_running_loop()
        self.connections: set[_HttpProtocol] = set()
        self.tasks: set[asyncio.Task[None]] = set()
        # The app's way to serve requests without a coroutine (the proxy's), if it has one:
        # ``serve_now(req)`` for a request whose body is all here, ``serve_head(req)`` for one
        # whose body is still arriving (False: serve it through ASGI instead).
        self.serve_now: Callable[[_Request], None] | None = getattr(app, "serve_now", None)
        self.serve_head: Callable[[_Request], bool] = getattr(app, "serve_head", _no_head)
        self.date = b""
        self._server: asyncio.Server | None = None
        self._sweeper: asyncio.TimerHandle | None = None
        self._refresh_date()

    def _refresh_date(self) -> None:
        self.date = b"date: " + formatdate(time.time(), usegmt=True).encode() + b"\r\n"

    async def start(self, sock: socket.socket) -> None:
        await self.app.startup()
        self._server = await self.loop.create_server(
            lambda: _HttpProtocol(self), sock=sock, backlog=4096
        )
        self._sweep()

    def _sweep(self) -> None:
        now = self.loop.time()
        self._refresh_date()
        for conn in list(self.connections):
            conn.sweep(now)
        interval = min(1.0, self.limits.head_timeout_s / 2)
        self._sweeper = self.loop.call_later(interval, self._sweep)

    async def shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            conn.shutdown()
        deadline = self.loop.time() + self.limits.graceful_s
        # In progress: a task (ASGI), or a request answered from callbacks (serve_now).
        while (
            self.tasks or any(conn.active is not None for conn in self.connections)
        ) and self.loop.time() < deadline:
            await asyncio.sleep(0.05)
        for task in list(self.tasks):
            task.cancel()
        for conn in list(self.connections):
            if conn.transport is not None:
                conn.transport.close()
        if self._sweeper is not None:
            self._sweeper.cancel()
        await self.app.shutdown()


def bind(host: str, port: int, reuse_port: bool = False) -> socket.socket:
    """A TCP socket bound to ``host:port`` (not listening yet). ``reuse_port``: with
    SO_REUSEPORT, so that several processes (``--workers``) can each listen on the port and
    the kernel spreads new connections across them."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.set_inheritable(True)
    return sock


async def serve(app: Any, sock: socket.socket, limits: ServerLimits, stop: asyncio.Event) -> None:
    """Serve until ``stop`` is set, then shut down gracefully."""
    server = HttpServer(app, limits)
    await server.start(sock)
    try:
        await stop.wait()
    finally:
        await server.shutdown()
