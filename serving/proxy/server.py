"""uvicorn's httptools protocol with the request-head limits uvicorn lacks.

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
  sent a byte is just closed). Not applied while a
  response is in progress (a pipelined head waits for it) nor to an idle keep-alive connection
  between requests (uvicorn's keep-alive timeout covers that).

- read-ahead: at most ``MAX_PIPELINE`` pipelined requests are queued behind the one being
  served (uvicorn queues every request a read holds); past that the queued ones are answered,
  the rest of the input is dropped and the connection closes after the last queued answer
  (the client retries the rest, RFC 9112 9.3.2), as the proxy's own server does. uvicorn
  itself serves the next pipelined request only after the previous answer's ``send``, which
  waits while the socket's buffer is full, so a client that never reads stalls its pipeline.

One periodic sweep per server (every ``head_timeout_s / 2``, at most 1 s) checks the deadlines;
no timer per connection or request. Request *bodies* are timed by the app (``body_timeout_s``,
works on any server).
"""

from __future__ import annotations

import asyncio
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from serving.proxy.httpserver import MAX_PIPELINE

__all__ = ["guarded_httptools_protocol"]

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

    # -- connection lifecycle -----------------------------------------------------------------
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._head_t0 = self.loop.time()
        live = self._live
        live.add(self)
        if self._sweeper[0] is None:
            self._arm_sweeper()

    def connection_lost(self, exc: Exception | None) -> None:
        self._live.discard(self)
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._closing or self._read_ahead_full:
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
        super().on_headers_complete()

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
            phrase = b"Request Timeout" if status == 408 else b"Request Header Fields Too Large"
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
