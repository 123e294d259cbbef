"""uvicorn's httptools protocol with the request-head limits uvicorn lacks (the proxy's one HTTP
server: serving/proxy/runner.py says why uvicorn).

uvicorn 0.54.0's ``HttpToolsProtocol`` bounds neither the size of a request head nor the time a
client may take to send one: httptools accumulates an unfinished header value in memory (16
connections x 32 MiB took a proxy from 48 MB to 637 MB, issue 14 item 8), and a new connection
that never sends a byte is kept forever (its keep-alive timer is armed only after a first
response). This subclass adds, per connection:

- ``max_head_bytes``: bytes received while a head is unfinished (request line + headers) are
  counted; above the limit the client gets ``431`` + ``Connection: close`` and the connection
  ends. A head that arrives complete in one read is checked on its parsed length too.
- ``head_timeout_s``: from the connection's start, or from the first byte of a later request,
  the head must be complete within this time, else ``408`` and close (a connection that never
  sent a byte is just closed). Not applied while a response is in progress (a pipelined head
  waits for it) nor to an idle keep-alive connection between requests (uvicorn's keep-alive
  timeout covers that).
- read-ahead: at most ``MAX_PIPELINE`` pipelined requests are queued behind the one being
  served (uvicorn queues every request a read holds); past that the queued ones are answered,
  the rest of the input is dropped and the connection closes after the last queued answer
  (the client retries the rest, RFC 9112 9.3.2). uvicorn itself serves the next pipelined
  request only after the previous answer's ``send``, which waits while the socket's buffer is
  full, so a client that never reads stalls its pipeline.
- lingering close: a connection closed after its answer (``Connection: close``, HTTP/1.0, or an
  answer given without reading the body the client announced) is half-closed first (FIN once
  what was written has gone out), then what the client still sends is read and dropped until
  it closes too or ``LINGER_S`` passes, as nginx's ``lingering_close`` does. uvicorn closes at
  once, and a socket closed with unread bytes makes the kernel answer RST, which can destroy
  the answer before the client read it (a 401 given before a body arrived lost its body ~1 in
  70 through the emulator's edge under load).
- HTTP/1.0: a response without ``Content-Length`` (a stream) is close-delimited (RFC 9112 6.3),
  where uvicorn would chunk-encode it for a client that cannot read chunks.

One periodic sweep per server (every ``head_timeout_s / 2``, at most 1 s) checks the head
deadlines; no timer per request (a lingering close has one). Request *bodies* are timed by
the app (``body_timeout_s``, works on any server).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

__all__ = ["LINGER_S", "MAX_PIPELINE", "guarded_httptools_protocol"]

# Requests parsed ahead of the one being served, at most (their heads and bodies are held).
MAX_PIPELINE = 16
# A connection closed after its answer reads (and drops) what the client still sends for at
# most this long after its FIN (nginx's lingering_close waits 5 s).
LINGER_S = 2.0

_CLOSE_RESPONSES = {
    408: b"Request Timeout: the request head was not complete in time",
    431: b"Request Header Fields Too Large",
}


class _GuardedHttpToolsProtocol(HttpToolsProtocol):
    """Set by ``guarded_httptools_protocol``: the limits and the per-server registry."""

    max_head_bytes = 32 * 1024
    head_timeout_s = 10.0
    _live: set[_GuardedHttpToolsProtocol]
    _sweeper: list[asyncio.TimerHandle | None]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._in_head = True  # between requests or inside an unfinished head
        self._head_bytes = 0  # raw bytes received since the current head began
        self._parsed_head = 0  # request-target + header bytes parsed for the current head
        self._head_t0: float | None = None  # loop time the current head began
        self._closing = False
        self._read_ahead_full = False  # MAX_PIPELINE queued: the rest of the input is dropped
        self._lingering: asyncio.TimerHandle | None = None  # half-closed: input is dropped
        self._cycle_transport: _CycleTransport | None = None

    # -- connection lifecycle -----------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._cycle_transport = _CycleTransport(transport, self._linger)
        self._head_t0 = self.loop.time()
        live = self._live
        live.add(self)
        if self._sweeper[0] is None:
            self._arm_sweeper()

    def connection_lost(self, exc: Exception | None) -> None:
        self._live.discard(self)
        if self._lingering is not None:
            self._lingering.cancel()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._closing or self._read_ahead_full or self._lingering is not None:
            return
        if self._in_head:
            if self._head_t0 is None:
                self._head_t0 = self.loop.time()
            self._head_bytes += len(data)
        super().data_received(data)
        if self._closing:
            return
        if self._in_head and self._head_bytes > self.max_head_bytes:
            self._refuse(431)

    # -- parser callbacks ---------------------------------------------------------------------
    def on_message_begin(self) -> None:
        self._parsed_head = 0
        super().on_message_begin()

    def on_url(self, url: bytes) -> None:
        self._parsed_head += len(url)
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._parsed_head += len(name) + len(value) + 4
        super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._in_head = False
        if self._read_ahead_full:
            return
        if len(self.pipeline) >= MAX_PIPELINE:
            # Not queued: the newest queued request closes the connection after its answer,
            # and nothing more of this connection is parsed into requests.
            self._read_ahead_full = True
            self.pipeline[0][0].keep_alive = False  # uvicorn queues with appendleft
            return
        if self._parsed_head > self.max_head_bytes:
            # Not handed to the app; the body callbacks below ignore the rest of this message.
            self._refuse(431)
            return
        before = self.cycle
        super().on_headers_complete()
        cycle = self.cycle
        if cycle is before:
            return
        cycle.transport = self._cycle_transport  # type: ignore[assignment]
        if cycle.scope["http_version"] == "1.0":
            cycle.send = _CloseDelimited(cycle, cycle.send)  # type: ignore[method-assign]

    def on_body(self, body: bytes) -> None:
        if not self._closing and not self._read_ahead_full:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if self._closing or self._read_ahead_full:
            return
        super().on_message_complete()
        self._in_head = True  # the next bytes start a new head (its clock starts with them)
        self._head_bytes = 0
        self._head_t0 = None

    def on_response_complete(self) -> None:
        if self._lingering is None:  # else the connection is ending: nothing more is served
            super().on_response_complete()

    # -- closing after an answer -----------------------------------------------------------------
    def _linger(self) -> None:
        """The cycle closes the connection after its answer: FIN once what was written has
        gone out (``write_eof``), then read and drop what the client still sends until it
        closes too (``eof_received`` then closes the transport) or ``LINGER_S`` passes."""
        transport = self.transport
        if self._lingering is not None or transport.is_closing():
            return
        if not transport.can_write_eof():
            transport.close()
            return
        try:
            transport.write_eof()
        except OSError:
            transport.close()
            return
        self._lingering = self.loop.call_later(LINGER_S, transport.close)
        transport.resume_reading()  # reading may be paused (a queued request, a large body)

    # -- limits --------------------------------------------------------------------------------
    def _refuse(self, status: int) -> None:
        """Answer ``status`` and close, unless a response is already in progress (then just
        close: a second status line inside it would corrupt what the client reads)."""
        self._closing = True
        transport = self.transport
        if transport is None or transport.is_closing():
            return
        cycle = self.cycle
        if cycle is None or cycle.response_complete:
            body = _CLOSE_RESPONSES[status]
            phrase = HTTPStatus(status).phrase.encode()
            transport.write(
                b"HTTP/1.1 %d %s\r\ncontent-type: text/plain; charset=utf-8\r\n"
                b"content-length: %d\r\nconnection: close\r\n\r\n%s"
                % (status, phrase, len(body), body)
            )
        transport.close()

    def _head_overdue(self, now: float) -> bool:
        if not self._in_head or self._head_t0 is None or self._closing:
            return False
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            return False  # a response is in progress: a pipelined head waits for it
        return now - self._head_t0 > self.head_timeout_s

    def _arm_sweeper(self) -> None:
        interval = min(1.0, self.head_timeout_s / 2)
        self._sweeper[0] = self.loop.call_later(interval, _sweep, type(self), self.loop, interval)


class _CycleTransport:
    """The connection as a request's cycle sees it: writes go straight to the transport (bound
    once per connection, no call in between), ``close`` lingers (``_linger``). uvicorn 0.54.0's
    ``RequestResponseCycle`` uses only these three."""

    __slots__ = ("close", "is_closing", "write")

    def __init__(self, transport: asyncio.Transport, close: Callable[[], None]) -> None:
        self.write = transport.write
        self.is_closing = transport.is_closing
        self.close = close


_FRAMING = frozenset({b"content-length", b"transfer-encoding"})


class _CloseDelimited:
    """An HTTP/1.0 request's ``send``: a response without ``Content-Length`` is sent as it is
    and ended by the close, where uvicorn 0.54.0 would add ``transfer-encoding: chunked``
    (its ``RequestResponseCycle.send`` chunk-encodes when ``chunked_encoding`` is None at
    the head, and checks each body message against ``expected_content_length``)."""

    __slots__ = ("cycle", "send", "until_close")

    def __init__(self, cycle: RequestResponseCycle, send: Callable[[Any], Awaitable[None]]) -> None:
        self.cycle = cycle
        self.send = send
        self.until_close = False

    async def __call__(self, message: Any) -> None:
        cycle = self.cycle
        if message["type"] == "http.response.start":
            self.until_close = (
                cycle.scope["method"] != "HEAD"
                and message["status"] not in (204, 304)
                and not any(name.lower() in _FRAMING for name, _ in message.get("headers", ()))
            )
            if self.until_close:
                cycle.chunked_encoding = False  # no chunked framing; keep_alive is off (1.0)
        elif self.until_close:
            cycle.expected_content_length = len(message.get("body", b""))  # this piece's
        await self.send(message)


def _sweep(
    cls: type[_GuardedHttpToolsProtocol], loop: asyncio.AbstractEventLoop, interval: float
) -> None:
    """One timer per server: refuse every connection whose head is overdue, re-arm while any
    connection is open."""
    now = loop.time()
    for proto in [p for p in cls._live if p._head_overdue(now)]:
        if proto._head_bytes:
            proto._refuse(408)
        else:  # not a byte since the connection opened: nothing to answer, just close
            proto._closing = True
            proto.transport.close()
    cls._sweeper[0] = loop.call_later(interval, _sweep, cls, loop, interval) if cls._live else None


def guarded_httptools_protocol(
    max_head_bytes: int, head_timeout_s: float
) -> type[HttpToolsProtocol]:
    """A protocol class for ``uvicorn.Config(http=...)`` with these limits (one class per
    server, so each server has its own registry and sweeper)."""
    return type(
        "GuardedHttpToolsProtocol",
        (_GuardedHttpToolsProtocol,),
        {
            "max_head_bytes": max_head_bytes,
            "head_timeout_s": head_timeout_s,
            "_live": set(),
            "_sweeper": [None],
        },
    )
