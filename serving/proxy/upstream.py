"""A small pooled HTTP/1.1 client for the proxy's single upstream (the engine on localhost).

Why our own client and not aiohttp's: issue 33 built the proxy on aiohttp 3.14.5's ClientSession
as a complete replacement (branch s39-proxy, 2026-11-28: this file 602 -> 152 code lines) and
measured it against this client, same run, 2 cores (``python -m bench.proxy --reps 3 --no-nginx
--only json,latency,streams`` and ``python -m bench.proxy.instructions``, docs/proxy.md):

    CPU instructions per request    chat 68 B +78 %, chat 64 KiB +45 %, stream of 16 events +105 %
    added p50, one at a time        68 B +0.279 vs +0.170 ms; stream TTFB +0.373 vs +0.241 ms
    1024 streams                    TTFT p99 414 vs 176 ms; 0.78x vs 0.85x of direct; 43 vs 28 us
                                    of CPU per event

and two answers users would get wrong: a chunk that breaks the framing after the head waits
for the request timeout (504 after up to 600 s) instead of a 502 at once (aiohttp's parser
rejects it without waking the body reader), and a reset during a body without a length passes
as a clean end (a cut answer relayed as complete). The time ran out before the H200 run, so the
decision rests on these. This one is an ``asyncio.Protocol`` whose responses httptools
parses (llhttp: status line, headers, Content-Length / chunked / read-until-close bodies; the
parser uvicorn serves the proxy's clients with), a LIFO keep-alive pool, and a response object
that hands body pieces to one consumer as soon as they arrive (no buffering beyond what the
socket delivered at once). What llhttp does not check, this module does: the head's size, a
status within 100-599, no 101.

Error classes tell the caller whether a retry is safe:
- ``ConnectFailed``: the engine was never reached (connect refused/timed out). Safe to retry.
- ``UpstreamBroken``: anything after the request bytes were handed to the socket. The engine
  may have started the work, so the caller must never re-send.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, cast
from urllib.parse import urlsplit

import httptools

__all__ = [
    "ConnectFailed",
    "ResponseListener",
    "UpstreamBroken",
    "UpstreamClient",
    "UpstreamError",
    "UpstreamResponse",
    "UpstreamTimeout",
]

_MAX_HEAD_BYTES = 64 * 1024
# Bodies from this size are written with the head in one writev (uvloop's writelines) instead
# of being joined to it: below it the copy costs less than the second buffer.
_GATHER_FROM = 16 * 1024
_NO_HOP: frozenset[bytes] = frozenset()
# Response headers ``_Conn.on_header`` reads beyond name and value.
_FRAMING_HEADERS = frozenset(
    {b"content-length", b"transfer-encoding", b"connection", b"content-type"}
)
_PAUSE_AT = 1024 * 1024  # pause reading the engine socket above this many unread bytes


class UpstreamError(Exception):
    """Base class: the engine could not serve the request."""


class ConnectFailed(UpstreamError):
    """The engine was never reached (nothing was sent): a retry is safe."""


class UpstreamBroken(UpstreamError):
    """The exchange failed after the request was sent: never retry."""


class UpstreamTimeout(UpstreamBroken):
    """The engine did not answer in time (no head, an incomplete answer, a silent stream)."""


class _Aborted(UpstreamBroken):
    """The proxy aborted the exchange itself (the client went away)."""


class ResponseListener(Protocol):
    """Receives one response's events from the engine connection's own callbacks (no task,
    no future): what the proxy's ``relay.Relay`` (serving/proxy/relay.py) implements.

    Each is called at most once per event, in order: ``on_head``, then ``on_data`` per body
    piece, then ``on_end`` or ``on_error`` (``on_error`` may come at any point, and ends the
    response); ``on_tick`` after each ``keepalive_ticks`` interval without body bytes.
    ``on_end(data)`` carries the body bytes of the read that completed the response (maybe
    none), so that a listener can write them and the end in one write: an engine's last
    event and its end usually come in one read. If an event raises, ``on_bug`` is called (it
    must not raise) instead of any further event, and the engine connection is dropped
    unless the response was complete (then it is back in the pool already)."""

    def on_head(self) -> None: ...
    def on_data(self, data: bytes) -> None: ...
    def on_end(self, data: bytes) -> None: ...
    def on_error(self, error: UpstreamError) -> None: ...
    def on_tick(self) -> None: ...
    def on_bug(self, exc: Exception) -> None: ...


@dataclass(slots=True, eq=False, repr=False)
class UpstreamResponse:
    """One response being received, in one of two modes:

    - pull (the health check, tests): ``head()`` waits for status and headers; ``read()``
      yields body pieces as they arrive, ``b""`` at the end;
    - push (the proxy's requests): ``listen(listener)`` right after the request was sent, and
      every event goes to the listener from the connection's callback (``ResponseListener``).
    """

    _conn: _Conn | None
    _loop: asyncio.AbstractEventLoop
    _head_future: asyncio.Future[None] | None = None  # made by head(), if called
    _head_seen: bool = False
    _head_timer: asyncio.TimerHandle | None = None
    _chunks: collections.deque[bytes] = field(default_factory=collections.deque)
    _buffered: int = 0
    _paused: bool = False
    _done: bool = False
    _error: UpstreamError | None = None
    _waiter: asyncio.Future[None] | None = None
    _last_data: float = 0.0  # loop time of the last body bytes (kept while ticks are on)
    _last_tick: float = 0.0
    _tick_interval: float = 0.0
    _tick_handle: asyncio.TimerHandle | None = None
    _listener: ResponseListener | None = None
    status: int = 0
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    content_type: bytes = b""
    # Header names the engine listed in its Connection header (hop-by-hop, not relayed).
    hop_headers: frozenset[bytes] = _NO_HOP
    # Right after the request was written: part of it still waits in the connection's
    # write buffer (over its high-water mark); ``when_request_written`` says when not.
    request_pending: bool = False

    # -- consumer side (pull) ------------------------------------------------------------
    async def head(self) -> None:
        """Wait for the status line and headers (raises an ``UpstreamError`` on failure)."""
        if not self._head_seen:
            if self._error is not None:
                raise self._error
            future = self._head_future
            if future is None:
                future = self._head_future = self._loop.create_future()
            await future

    async def read(self) -> bytes:
        """Next body bytes (all that arrived since the last call), ``b""`` when the body is
        complete."""
        while True:
            chunks = self._chunks
            if chunks:
                data = chunks.popleft() if len(chunks) == 1 else b"".join(chunks)
                chunks.clear()
                self._buffered = 0
                self.resume_reading()
                return data
            if self._error is not None:
                raise self._error
            if self._done:
                return b""
            waiter = self._loop.create_future()
            self._waiter = waiter
            try:
                await waiter
            finally:
                self._waiter = None

    async def read_all(self, limit: int) -> bytes:
        """The whole body (raises ``UpstreamBroken`` if it exceeds ``limit`` bytes)."""
        parts: list[bytes] = []
        size = 0
        while True:
            data = await self.read()
            if not data:
                return b"".join(parts)
            size += len(data)
            if size > limit:
                self.abort()
                raise UpstreamBroken(f"engine response body exceeds {limit} bytes")
            parts.append(data)

    # -- consumer side (push) ------------------------------------------------------------
    def listen(self, listener: ResponseListener | None) -> None:
        """Push mode: every event of this response goes to ``listener`` (None: no more
        events). Call it before the event loop runs again after ``request`` returned."""
        self._listener = listener

    def keepalive_ticks(self, interval: float) -> None:
        """Push mode: ``on_tick`` after each ``interval`` seconds without body bytes."""
        if interval <= 0 or self._done:
            return
        self._tick_interval = interval
        self._last_data = self._loop.time()
        self._tick_handle = self._loop.call_at(self._last_data + interval, self._on_tick)

    def end_deadline(self) -> None:
        """No deadline for the rest of this response (``head_timeout_s`` of ``request``
        covered its head): a stream, timed by its silence limit from now on; also once the
        response is over."""
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def when_request_written(self, callback: Callable[[], None]) -> None:
        """``callback()`` once the write buffer is below its low-water mark, or when the
        connection is gone (its buffer with it); at once if neither is pending."""
        conn = self._conn
        if conn is not None and conn.write_paused and not conn.closed:
            conn.on_written.append(callback)
        else:
            callback()

    def pause_reading(self) -> None:
        conn = self._conn
        if not self._paused and conn is not None and conn.transport is not None:
            self._paused = True
            conn.transport.pause_reading()

    def resume_reading(self) -> None:
        conn = self._conn
        if self._paused:
            self._paused = False
            if conn is not None and conn.transport is not None:
                conn.transport.resume_reading()

    @property
    def reading_paused(self) -> bool:
        return self._paused

    def idle_s(self) -> float:
        """Seconds since the last body bytes arrived (or ``keepalive_ticks`` was called);
        only meaningful while keep-alive ticks are on."""
        return self._loop.time() - self._last_data

    def abort(self, error: UpstreamError | None = None) -> None:
        """Drop the engine connection at once (the engine sees a disconnect and aborts); the
        response fails with ``error`` (default: the client went away)."""
        if self._done:
            return
        self._fail(error or _Aborted("aborted by the proxy: the client went away"))
        conn = self._conn
        if conn is not None:
            conn.abort()

    @property
    def finished(self) -> bool:
        return self._done

    # -- producer side (called by the connection) -----------------------------------------
    def _notify(self, listener: ResponseListener, event: Callable[[], None]) -> None:
        """Call one of ``listener``'s events; if it raises (a bug of the proxy's): drop the
        engine connection and hand the exception to ``on_bug``; no further event follows."""
        try:
            event()
        except Exception as exc:
            self._listener_failed(listener, exc)

    def _listener_failed(self, listener: ResponseListener, exc: Exception) -> None:
        self._listener = None
        if not self._done:
            self._close(UpstreamBroken(f"handling the engine's response failed: {exc!r}"))
        conn = self._conn
        if conn is not None:
            conn.abort()
        listener.on_bug(exc)

    def _close(self, error: UpstreamError | None) -> None:
        """The response is over (with ``error``, or complete): no tick, no deadline."""
        self._done = True
        self._error = error
        if self._tick_handle is not None:
            self._tick_handle.cancel()
            self._tick_handle = None
        self.end_deadline()

    def _wake(self) -> None:
        """Wake the pull consumer waiting in ``read``."""
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def _set_head(self) -> None:
        self._head_seen = True
        listener = self._listener
        if listener is not None:
            # Push mode: the deadline stays until the response is complete (a non-stream
            # answer whose body stalls must end too, issue 22 item 3), unless the listener
            # ends it (``end_deadline``: a stream, whose silence limit takes over).
            self._notify(listener, listener.on_head)
            return
        self.end_deadline()
        future = self._head_future
        if future is not None and not future.done():
            future.set_result(None)

    def _push(self, data: bytes) -> None:
        if self._tick_interval:
            self._last_data = self._loop.time()
        listener = self._listener
        if listener is not None:  # _notify inlined: this runs once per relayed SSE event
            try:
                listener.on_data(data)
            except Exception as exc:
                self._listener_failed(listener, exc)
            return
        self._chunks.append(data)
        self._buffered += len(data)
        self._wake()
        if self._buffered > _PAUSE_AT:
            self.pause_reading()

    def _finish(self, last: bytes = b"") -> None:
        """The response is complete; ``last``: the body bytes of the read that completed it."""
        if self._done:  # failed or aborted while its last piece was handled
            return
        self._close(None)
        self._conn = None
        listener = self._listener
        if listener is not None:
            self._listener = None  # nothing follows the end
            try:  # _notify inlined: it takes no argument for the event
                listener.on_end(last)
            except Exception as exc:
                self._listener_failed(listener, exc)
            return
        if last:
            self._chunks.append(last)
            self._buffered += len(last)
        self._wake()

    def _fail(self, error: UpstreamError) -> None:
        if self._done:
            return
        self._close(error)
        listener = self._listener
        if listener is not None:
            self._listener = None  # nothing follows the failure
            self._notify(listener, lambda: listener.on_error(error))
            return
        future = self._head_future
        if future is not None and not future.done():
            future.set_exception(error)
            # Nobody may ever await it (the client went away first): silence the warning.
            future.exception()
        self._wake()

    def _head_timed_out(self, timeout: float) -> None:
        self._head_timer = None
        what = "its whole answer" if self._head_seen else "a response head"
        self.abort(UpstreamTimeout(f"engine did not send {what} within {timeout:g} s"))

    def _on_tick(self) -> None:
        self._tick_handle = None
        if self._done:
            return
        now = self._loop.time()
        due = max(self._last_data, self._last_tick) + self._tick_interval
        if now >= due - 1e-3:
            self._last_tick = now
            due = now + self._tick_interval
            self._tick_handle = self._loop.call_at(due, self._on_tick)
            listener = self._listener
            if listener is not None:
                self._notify(listener, listener.on_tick)
            return
        self._tick_handle = self._loop.call_at(due, self._on_tick)


class _Conn(asyncio.Protocol):
    """One keep-alive connection to the engine; httptools (llhttp) parses its responses, one
    at a time. The callbacks below (``on_*``) are httptools' parser protocol."""

    def __init__(self, pool: UpstreamClient) -> None:
        self.pool = pool
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.idle_since = 0.0
        self.resp: UpstreamResponse | None = None
        self.head_only = False
        self._parser = httptools.HttpResponseParser(self)
        self._in_head = False  # a response head is being received
        self._head_bytes = 0  # bytes received since it began (a bound on what llhttp holds)
        self._parsed_head = 0  # header bytes parsed of it
        self._informational = False  # the head parsed last is a 1xx one (skipped)
        self._framed = False  # the head has a Content-Length or chunked framing
        self._until_eof = False  # the body ends when the engine closes the connection
        self._ended = False  # the response was complete in the read being parsed
        self._keep_alive = True
        self._pieces: list[bytes] = []  # body pieces of the read being parsed
        self.write_paused = False  # the write buffer is over its high-water mark
        self.on_written: list[Callable[[], None]] = []  # called once it is below, or lost

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        self._written()

    def _written(self) -> None:
        callbacks = self.on_written
        if callbacks:
            self.on_written = []
            for callback in callbacks:
                callback()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._written()
        resp = self.resp
        self.resp = None
        if resp is None:
            return
        if self._until_eof and exc is None:  # a clean close ends such a body
            resp._finish()
        else:
            why = f": {exc}" if exc else ""
            resp._fail(UpstreamBroken(f"engine closed the connection mid-response{why}"))

    def data_received(self, data: bytes) -> None:
        resp = self.resp
        if resp is None:  # bytes nobody asked for: the connection is unusable
            self.abort()
            return
        pieces = self._pieces
        try:
            if self._in_head:
                self._head_bytes += len(data)
            try:
                self._parser.feed_data(data)
            except httptools.HttpParserError as exc:
                if not self._ended:
                    raise _malformed(exc) from None
                if not isinstance(exc.__context__, _HeadEnded):
                    # Bytes after the complete response: it stands, the connection goes.
                    self._keep_alive = False
            if self._in_head and self._head_bytes > _MAX_HEAD_BYTES:
                raise UpstreamBroken("engine response head is larger than 64 KiB")
        except UpstreamBroken as exc:
            self.resp = None
            pieces.clear()
            resp._fail(exc)
            self.abort()
            return
        if self._ended:
            self._complete(resp, pieces)
        elif pieces:
            resp._push(pieces[0] if len(pieces) == 1 else b"".join(pieces))
            pieces.clear()

    # httptools' parser protocol
    def on_message_begin(self) -> None:
        if self._ended:
            raise UpstreamBroken("engine sent bytes after a complete response")
        self._in_head = True
        self._parsed_head = 0
        self._informational = False
        self._framed = False
        resp = self.resp
        if resp is not None:
            resp.headers = []
            resp.content_type = b""
            resp.hop_headers = _NO_HOP

    def on_header(self, name: bytes, value: bytes) -> None:
        self._parsed_head += len(name) + len(value) + 4
        resp = self.resp
        if resp is None:
            return
        name = name.lower()
        value = value.rstrip(b" \t")  # llhttp strips the leading whitespace (RFC 9110 5.5)
        resp.headers.append((name, value))
        if name not in _FRAMING_HEADERS:  # most headers: nothing more to look at
            return
        if name == b"content-type":
            resp.content_type = value.lower()
        elif name == b"transfer-encoding":
            self._framed = value.lower()[-7:] == b"chunked"  # not endswith: see sse.py
        elif name == b"content-length":
            self._framed = True
        else:  # connection: the headers it names are hop-by-hop (not relayed)
            tokens = {token.strip(b" \t") for token in value.lower().split(b",")}
            tokens -= {b"close", b"keep-alive", b""}
            if tokens:
                resp.hop_headers = resp.hop_headers | tokens

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._head_bytes = 0
        if self._parsed_head > _MAX_HEAD_BYTES:  # a whole head that came in one read
            raise UpstreamBroken("engine response head is larger than 64 KiB")
        status = self._parser.get_status_code()
        if not 100 <= status <= 599:
            raise UpstreamBroken(f"engine sent a malformed status code ({status})")
        if status < 200:
            if status == 101:  # never asked for (no Upgrade is sent): nothing HTTP follows
                raise UpstreamBroken("engine switched protocols (101) though no upgrade was asked")
            self._informational = True  # skipped: the real head follows
            return
        resp = self.resp
        if resp is None:
            return
        resp.status = status
        self._until_eof = not self._framed and status not in (204, 304)
        resp._set_head()
        if self.head_only:
            # llhttp cannot be told that a HEAD answer has no body: the response ends here,
            # parsing stops (the parser is replaced for the next one).
            self._keep_alive = self._parser.should_keep_alive()
            self._ended = True
            self._until_eof = False
            self._parser = httptools.HttpResponseParser(self)
            raise _HeadEnded

    def on_body(self, body: bytes) -> None:
        self._pieces.append(body)

    def on_message_complete(self) -> None:
        if self._informational:
            return
        self._keep_alive = self._parser.should_keep_alive()
        self._until_eof = False
        self._ended = True

    # request side
    def start(self, resp: UpstreamResponse, head_only: bool) -> None:
        self.resp = resp
        self.head_only = head_only
        self._in_head = True
        self._head_bytes = 0
        self._ended = False
        self._until_eof = False
        self._keep_alive = True

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def _complete(self, resp: UpstreamResponse, pieces: list[bytes]) -> None:
        # The read's last body bytes go with the end (``on_end(data)``): one write for both.
        last = (pieces[0] if len(pieces) == 1 else b"".join(pieces)) if pieces else b""
        pieces.clear()
        self.resp = None
        if resp._paused:
            # Earlier pieces pushed the unread backlog over _PAUSE_AT. The response owns no
            # connection once finished, so resume here: a paused connection in the pool would
            # never read the next response (it would hang until the head timeout).
            resp._paused = False
            if self.transport is not None and not self.closed:
                self.transport.resume_reading()
        # Back in the pool before the response's end is announced: whatever the end sets off
        # (the next request) may use this connection at once.
        if self._keep_alive and not self.closed:
            self.pool._release(self)
        else:
            self.abort()
        resp._finish(last)


class _HeadEnded(Exception):
    """Raised from ``on_headers_complete`` to stop parsing a HEAD answer at its head."""


def _malformed(exc: httptools.HttpParserError) -> UpstreamBroken:
    """The error for a response httptools refused: our own check's (raised in a callback), or
    llhttp's reason, with what the rule is for the header errors."""
    cause = exc.__context__
    if isinstance(cause, UpstreamBroken):
        return cause
    reason = str(exc) or exc.__class__.__name__
    if "header value" in reason:
        reason += " (a header value must not hold CR, LF, NUL or other controls)"
    elif "header token" in reason:
        reason += " (a header name must be a token: no spaces, CR, LF or NUL)"
    return UpstreamBroken(f"engine sent a malformed response: {reason}")


class UpstreamClient:
    """Keep-alive pool of connections to one ``http://host:port`` origin.

    ``idle_ttl_s`` must stay below the engine's own keep-alive timeout so we never write a
    request onto a connection the engine is closing at the same moment: uvicorn's default is
    5 s, so the engine must be started with a longer one than the proxy's
    ``--upstream-idle-s`` (vLLM: ``VLLM_HTTP_TIMEOUT_KEEP_ALIVE``, SGLang:
    ``SGLANG_TIMEOUT_KEEP_ALIVE``; docs/proxy.md).
    """

    def __init__(
        self,
        base_url: str,
        *,
        connect_timeout_s: float = 2.0,
        connect_retries: int = 3,
        retry_backoff_s: float = 0.05,
        idle_ttl_s: float = 4.0,
        max_idle: int = 1024,
        max_connecting: int = 32,
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(
                f"upstream URL {base_url!r} is not supported: use http://HOST:PORT "
                "(the engine runs beside the proxy on localhost, plain HTTP)"
            )
        if parts.path not in ("", "/") or parts.query:
            raise ValueError(f"upstream URL {base_url!r} must not have a path or query")
        self.host = parts.hostname
        self.port = parts.port or 80
        self.base_url = base_url
        self._host_header = parts.netloc.encode("ascii")
        self.connect_timeout_s = connect_timeout_s
        self.connect_retries = connect_retries
        self.retry_backoff_s = retry_backoff_s
        self.idle_ttl_s = idle_ttl_s
        self.max_idle = max_idle
        # New connections being made at once, at most: a burst after a quiet spell (or at
        # start) ramps up instead of opening hundreds at once against a busy engine; requests
        # past it wait for a connect slot or for a connection another request gives back.
        self.max_connecting = max_connecting
        self._connecting = 0
        self._waiters: collections.deque[asyncio.Future[_Conn | None]] = collections.deque()
        self._idle: list[_Conn] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self.retries = 0  # connect retries done (a metric)

    async def request(
        self,
        method: bytes,
        target: bytes,
        headers: list[tuple[bytes, bytes]],
        body: bytes | memoryview = b"",
        *,
        head_timeout_s: float | None = None,
        retry_connect: bool = True,
    ) -> UpstreamResponse:
        """Send one request and return its response once it is *sent* (await ``head()`` next,
        or ``listen``). An idle pooled connection is used when there is one, else a new one.
        ``head_timeout_s``: the head must arrive within it (pull mode), or, with a listener
        (push mode), the whole response unless the listener calls ``end_deadline``.

        Connect failures are retried (``connect_retries`` times, exponential backoff) because
        the engine saw nothing; nothing is retried once bytes were written.
        """
        loop = self.running_loop()
        attempt = 0
        while True:
            conn = self._pop_idle()
            if conn is not None:
                break
            if self._connecting >= self.max_connecting:
                conn = await self._wait_for_slot(loop)
                if conn is not None:  # one given back by a finished request
                    break
                continue
            self._connecting += 1
            try:
                conn = await self._connect(loop)
                break
            except ConnectFailed:
                if not retry_connect or attempt >= self.connect_retries:
                    raise
            finally:
                self._connecting -= 1
                self._wake_waiter(None)
            await asyncio.sleep(self.retry_backoff_s * (2**attempt))
            attempt += 1
            self.retries += 1
        return self._send(conn, loop, method, target, headers, body, head_timeout_s)

    async def _wait_for_slot(self, loop: asyncio.AbstractEventLoop) -> _Conn | None:
        """Wait until a connect slot frees up (None) or a request gives its connection back
        (that connection, open)."""
        waiter: asyncio.Future[_Conn | None] = loop.create_future()
        self._waiters.append(waiter)
        try:
            conn = await waiter
        except BaseException:
            if waiter.done() and not waiter.cancelled():  # woken as we were cancelled
                handed = waiter.result()
                if handed is not None:
                    self._release(handed)  # pass the connection on
                else:
                    self._wake_waiter(None)  # and the free slot
            raise
        if conn is not None and (conn.closed or conn.transport is None):
            return None
        return conn

    def _wake_waiter(self, conn: _Conn | None) -> bool:
        """Hand ``conn`` (or a free connect slot: None) to the first waiting request."""
        waiters = self._waiters
        while waiters:
            waiter = waiters.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return True
        return False

    def running_loop(self) -> asyncio.AbstractEventLoop:
        loop = self._loop
        if loop is None or loop.is_closed():
            # Cached: asyncio.get_running_loop() costs a getpid() syscall per call. A client
            # lives on one loop (the proxy's); a closed loop means a new one took over.
            loop = self._loop = asyncio.get_running_loop()
        return loop

    def _send(
        self,
        conn: _Conn,
        loop: asyncio.AbstractEventLoop,
        method: bytes,
        target: bytes,
        headers: list[tuple[bytes, bytes]],
        body: bytes | memoryview,
        head_timeout_s: float | None,
    ) -> UpstreamResponse:
        resp = UpstreamResponse(conn, loop)
        conn.start(resp, head_only=method == b"HEAD")
        out: list[bytes | memoryview] = [
            method, b" ", target, b" HTTP/1.1\r\nhost: ", self._host_header, b"\r\n"
        ]  # fmt: skip
        for name, value in headers:
            out += (name, b": ", value, b"\r\n")
        if body or method in (b"POST", b"PUT", b"PATCH"):
            out += (b"content-length: ", str(len(body)).encode("ascii"), b"\r\n")
        out.append(b"\r\n")
        assert conn.transport is not None
        if len(body) < _GATHER_FROM:
            out.append(body)
            conn.transport.write(b"".join(out))
        else:  # one writev of head and body: the body is not copied once more
            conn.transport.writelines((b"".join(out), body))
        if conn.write_paused:
            resp.request_pending = True
        if head_timeout_s:
            resp._head_timer = loop.call_later(head_timeout_s, resp._head_timed_out, head_timeout_s)
        return resp

    def _pop_idle(self) -> _Conn | None:
        """The most recently used idle connection that is still open and young enough."""
        idle = self._idle
        if idle:
            now = time.monotonic()
            while idle:
                conn = idle.pop()
                if self._reusable(conn, now):
                    return conn
        return None

    def _reusable(self, conn: _Conn, now: float) -> bool:
        """An idle connection that is still open and young enough (one idle past
        ``idle_ttl_s`` is aborted)."""
        transport = conn.transport
        if conn.closed or transport is None or transport.is_closing():
            return False
        if now - conn.idle_since > self.idle_ttl_s:
            conn.abort()
            return False
        return True

    async def _connect(self, loop: asyncio.AbstractEventLoop) -> _Conn:
        try:
            _, proto = await asyncio.wait_for(
                loop.create_connection(lambda: _Conn(self), self.host, self.port),
                self.connect_timeout_s,
            )
        except (TimeoutError, OSError) as exc:
            raise ConnectFailed(
                f"cannot connect to the engine at {self.host}:{self.port}: "
                f"{exc.__class__.__name__}: {exc}"
            ) from None
        conn = proto
        sock = conn.transport.get_extra_info("socket") if conn.transport else None
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return conn

    def _release(self, conn: _Conn) -> None:
        if self._waiters and self._wake_waiter(conn):
            return
        if len(self._idle) >= self.max_idle:
            conn.abort()
            return
        conn.idle_since = time.monotonic()
        self._idle.append(conn)

    def prune(self) -> None:
        """Drop idle connections that are closed or past ``idle_ttl_s`` (called periodically;
        ``_acquire`` also skips them, but only from the top of the stack)."""
        now = time.monotonic()
        self._idle = [conn for conn in self._idle if self._reusable(conn, now)]

    @property
    def idle_connections(self) -> int:
        return len(self._idle)

    def close(self) -> None:
        """Close every idle connection (in-flight ones close when their response ends)."""
        for conn in self._idle:
            conn.abort()
        self._idle.clear()
