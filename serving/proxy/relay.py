"""The engine's answer to one request, relayed to the client from callbacks.

Once the proxy has sent a request to the engine (``app.py`` decides whether and how), a
``Relay`` is the response's listener (``upstream.ResponseListener``): the engine connection's
own callbacks hand it the head, each body piece, the end or a failure, and a keep-alive tick
per silent interval; the relay writes to the client through a ``ClientWriter`` (app.py's
ASGI adapter) in the same callback. The relay adds no task, coroutine or future per request,
and a streamed event costs one call from the engine's read to the client's writer (issue 13:
docs/proxy.md).

What the client gets:
- a non-stream answer: read whole (so usage can be counted and a broken body becomes a 502),
  within ``max_response_bytes`` and the global buffer budget (503 ``proxy_buffers_full``),
  then sent in one write with the engine's headers minus the hop-by-hop ones;
- a stream (``text/event-stream``): each piece as it arrives (the last read's events and the
  end in one write: ``on_end`` carries them), ``: keep-alive`` comments while
  the engine is silent (only between events), usage-only chunks the client did not ask for
  counted then dropped (``sse.py``); a failure after the 200 head ends the stream with an SSE
  error event and ``[DONE]``, never a silent truncation; the engine is read no faster than the
  client takes the bytes (``write_piece`` says when to stop, ``when_drained`` when to go on);
- a failure before the head: 502 (broken) or 504 (no head, or for a non-stream answer no
  whole answer, within ``upstream_timeout_s``); a stream broken after its 200 head is
  accounted as 502 (504 when the engine fell silent), never as the 200 the client saw first;
- the client leaving: the engine request is aborted at once (the engine stops generating).

A bug in this code (an exception in a callback) drops the engine connection and fails the
client's response: 500 before its head, a cut connection after (``ClientWriter.fail``).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from serving.proxy.exchange import Exchange
from serving.proxy.logs import event_log
from serving.proxy.metrics import Metrics
from serving.proxy.sse import UsageChunkFilter
from serving.proxy.upstream import UpstreamBroken, UpstreamError, UpstreamResponse, UpstreamTimeout

__all__ = ["KEEPALIVE_COMMENT", "ClientWriter", "Relay", "RelayHost", "error_body", "scan_usage"]


KEEPALIVE_COMMENT = b": keep-alive\n\n"
_STREAM_HEADERS = [(b"x-accel-buffering", b"no"), (b"cache-control", b"no-cache")]
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
# Starts with its literal quote so the regex engine can skip ahead to each quote; a lookbehind
# for the backslash of an escaped quote (`(?<!\\)`) made it try every position (3x slower on a
# typical answer); `scan_usage` checks that byte itself.
_USAGE_RE = re.compile(rb'"(prompt_tokens|completion_tokens)"\s*:\s*(\d{1,15})(?![\d.eE])')
# Whether bytes may hold a usage object. A regex search, not ``b'_tokens"' in data``: in CPython
# 3.11 ``bytes.__contains__`` first tries its argument as an integer, and the TypeError it
# raises and clears costs ~1.8k instructions per test (``bench.proxy.instructions``).
_HAS_TOKENS = re.compile(rb'_tokens"').search


class ClientWriter(Protocol):
    """Where a relay writes the answer: ``app._AsgiWriter``, over uvicorn's ASGI ``send``
    (declared here, so that this module needs nothing from app.py, which builds on it)."""

    disconnected: bool
    # Called once when the client's connection is lost (set by the relay while it runs).
    on_disconnect: Callable[[], None] | None

    def respond(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> bool:
        """A whole answer (headers include ``content-length``); True: the client has not
        taken all of it yet (``when_flushed`` says when it has)."""

    def start_stream(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        """The head of an answer whose body follows in pieces."""

    def write_piece(self, data: bytes) -> bool:
        """One non-empty piece of a started stream; True: the client's buffer is full, stop
        producing until ``when_drained`` calls back."""

    def end_stream(self, data: bytes) -> None:
        """The stream's last bytes (may be empty) and its end."""

    def when_drained(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once the client's buffer has room again."""

    def when_flushed(self, callback: Callable[[], None]) -> None:
        """Call ``callback`` once what was written has gone to the client, or the client is
        gone."""

    def fail(self) -> None:
        """A bug of ours: 500 if no head went out yet, else cut the connection."""


class RelaySettings(Protocol):
    @property
    def max_response_bytes(self) -> int: ...
    @property
    def keepalive_s(self) -> float: ...
    @property
    def upstream_timeout_s(self) -> float: ...


class RelayHost(Protocol):
    """What a relay needs from the app that sent the request (``app.ProxyApp``)."""

    @property
    def config(self) -> RelaySettings: ...
    @property
    def metrics(self) -> Metrics: ...

    def hold(self, ex: Exchange, size: int) -> bool:
        """Take ``size`` bytes of the global buffer budget for ``ex`` (False: not available)."""

    def answer_error(self, writer: ClientWriter, ex: Exchange, code: str, message: str) -> None:
        """An OpenAI-style error answer (its status follows from ``code``: app.ERRORS)."""

    def answer_buffers_full(self, writer: ClientWriter, ex: Exchange) -> None:
        """503 proxy_buffers_full."""


def error_body(message: str, type_: str, code: str) -> bytes:
    return json.dumps(
        {"error": {"message": message, "type": type_, "param": None, "code": code}}
    ).encode()


def scan_usage(data: bytes, ex: Exchange) -> None:
    """Token counts from an OpenAI ``usage`` object in ``data`` (the last one wins)."""
    for match in _USAGE_RE.finditer(data):
        start = match.start()
        if start and data[start - 1] == 0x5C:  # \" : a quote inside a string, not a key
            continue
        name, value = match.groups()
        if name == b"prompt_tokens":
            ex.prompt_tokens = int(value)
        else:
            ex.completion_tokens = int(value)


class _BuffersFull(UpstreamBroken):
    """The non-stream answer does not fit in the proxy's buffer budget (503, not 502)."""


@dataclass(slots=True, eq=False, repr=False)
class Relay:
    """One request's engine response, relayed to the client (see the module docstring).
    ``on_done`` is called once, when the client's answer is complete, failed or abandoned."""

    app: RelayHost
    ex: Exchange
    writer: ClientWriter
    on_done: Callable[[Relay], None]
    resp: UpstreamResponse | None = None
    t_sent: float = 0.0  # the request was handed to the engine's socket
    t_in: float = 0.0  # the engine's head (stream) or whole answer (non-stream) was in
    done: bool = False
    backlogged: bool = False  # the whole answer is not all taken by the client yet
    streaming: bool = False
    # non-stream: the body read so far
    parts: list[bytes] = field(default_factory=list)
    size: int = 0
    # stream: where the client is in the SSE event stream, the usage seen, the filter
    at_boundary: bool = True  # the last byte relayed ended an SSE event
    ending: bool = False  # on_end is passing the last bytes through on_data
    last_out: bytes = b""  # what on_data left to send with the end (while ``ending``)
    scan: bool = False
    strip: UsageChunkFilter | None = None
    tail: bytes = b""
    # Token counts are read from the last two reads that carried any (a usage object may
    # straddle two reads; vLLM repeats running totals on every chunk, so scanning each
    # read would be wasted work): at the end, however the stream ends.
    usage_prev: bytes | None = None
    usage_last: bytes | None = None

    def start(self, resp: UpstreamResponse, t_sent: float) -> None:
        """The request was just sent: listen to its response and to the client leaving."""
        self.resp = resp
        self.t_sent = t_sent
        resp.listen(self)
        writer = self.writer
        if writer.disconnected:
            self.client_left()
        else:
            writer.on_disconnect = self.client_left

    def abandon(self) -> None:
        """The client's side failed (an ASGI ``send`` raised): drop the engine request, with
        no further event (the caller ends the request)."""
        if self.done:
            return
        self.done = True
        self.writer.on_disconnect = None
        resp = self.resp
        if resp is not None:
            resp.listen(None)
            resp.abort()

    # -- client side -----------------------------------------------------------------------
    def client_left(self) -> None:
        """The client's connection is gone: abort the engine request (it stops generating)."""
        if not self.done:
            self.ex.client_gone = True
            if self.resp is not None:
                self.resp.abort()

    def _drained(self) -> None:
        if not self.done and self.resp is not None:
            self.resp.resume_reading()

    def _write(self, data: bytes) -> None:
        if self.writer.write_piece(data):
            self._client_full()

    def _client_full(self) -> None:
        """The client's socket buffer is full: stop reading the engine until it drains."""
        resp = self.resp
        if resp is not None:
            resp.pause_reading()
        self.writer.when_drained(self._drained)

    # -- ResponseListener ------------------------------------------------------------------
    def on_head(self) -> None:
        resp = self.resp
        assert resp is not None
        if resp.content_type[:17] == b"text/event-stream":  # not startswith: see sse.py
            self.t_in = time.perf_counter()
            self._start_stream(resp)

    def on_data(self, data: bytes) -> None:
        if not self.streaming:  # a non-stream answer: read whole
            error = self._keep(data)
            if error is not None:
                assert self.resp is not None
                self.resp.abort(error)
            return
        ex = self.ex
        if ex.ttft is None:
            ex.ttft = time.perf_counter() - ex.t0
        if self.scan:
            window = self.tail + data
            if _HAS_TOKENS(window) is not None:
                self.usage_prev, self.usage_last = self.usage_last, window
            self.tail = window[-192:]
        at_boundary = data[-2:] == b"\n\n" or data[-4:] == b"\r\n\r\n"  # see sse.py
        strip = self.strip
        # The filter's common case inlined (whole events, none usage-only: passed as they are);
        # else it holds back half an event, or drops a usage-only chunk.
        if strip is not None and (strip.held or not at_boundary or strip.may_drop(data)):
            data = strip.feed(data)
            if not data:
                return  # held back: part of an event, or a dropped usage chunk
            at_boundary = data[-2:] == b"\n\n" or data[-4:] == b"\r\n\r\n"
        self.at_boundary = at_boundary
        if self.ending:
            self.last_out = data  # sent with the end, in one write
            return
        if self.writer.write_piece(data):  # _write inlined: this runs once per relayed event
            self._client_full()

    def on_end(self, data: bytes) -> None:
        if self.streaming:
            if data:  # the last events came with the end: scanned and filtered as any read
                self.ending = True
                self.on_data(data)
                data = self.last_out
            if self.strip is not None:
                data += self.strip.flush()
            self.writer.end_stream(data)
            self._finish()
            return
        if data:
            error = self._keep(data)
            if error is not None:
                self.on_error(error)
                return
        self.t_in = time.perf_counter()
        self._respond_whole()

    def _keep(self, data: bytes) -> UpstreamError | None:
        """Hold a piece of a non-stream answer; the error to end it with when it does not fit."""
        self.size += len(data)
        limit = self.app.config.max_response_bytes
        if self.size > limit:
            return UpstreamBroken(f"engine response body exceeds {limit} bytes")
        if not self.app.hold(self.ex, len(data)):
            return _BuffersFull("proxy buffers full")
        self.parts.append(data)
        return None

    def on_error(self, error: UpstreamError) -> None:
        ex = self.ex
        app = self.app
        if ex.client_gone:
            ex.status = 499
        elif isinstance(error, _BuffersFull):
            app.answer_buffers_full(self.writer, ex)
        elif not self.streaming:
            timeout = isinstance(error, UpstreamTimeout)
            app.metrics.upstream_errors["timeout" if timeout else "broken"] += 1
            app.answer_error(
                self.writer, ex, "engine_timeout" if timeout else "engine_failed",
                f"engine request failed: {error}",
            )  # fmt: skip
        else:
            self._end_stream_with_error(error)
        self._finish()

    def on_tick(self) -> None:
        resp = self.resp
        if not self.streaming or resp is None or resp.reading_paused:
            return  # paused: the engine waits for the client, not the other way round
        idle_limit = self.app.config.upstream_timeout_s
        if resp.idle_s() >= idle_limit - 1e-3:
            resp.abort(UpstreamTimeout(f"engine sent nothing for {idle_limit:g} s"))
        elif self.at_boundary and self.app.config.keepalive_s:
            self._write(KEEPALIVE_COMMENT)  # never inside an event the engine has half sent

    def on_bug(self, exc: Exception) -> None:
        ex = self.ex
        # 500 before a head went out; a stream cut after its head is one too (not its 200)
        ex.status = 500 if self.streaming or not ex.status else ex.status
        ex.error = f"proxy_internal_error: {exc.__class__.__name__}"
        event_log.error("proxy internal error", exc_info=exc)
        self.writer.fail()
        self._finish()

    # -- the answer ------------------------------------------------------------------------
    def _response_headers(self, resp: UpstreamResponse) -> list[tuple[bytes, bytes]]:
        drop = (
            _DROP_RESPONSE_HEADERS | resp.hop_headers
            if resp.hop_headers
            else _DROP_RESPONSE_HEADERS
        )
        return [(name, value) for name, value in resp.headers if name not in drop]

    def _respond_whole(self) -> None:
        resp = self.resp
        assert resp is not None
        ex = self.ex
        parts = self.parts
        data = parts[0] if len(parts) == 1 else b"".join(parts)
        self.parts = []
        out = self._response_headers(resp)
        out.append((b"content-length", str(len(data)).encode()))
        ex.overhead = (self.t_sent - ex.t0) + (time.perf_counter() - self.t_in)
        out.append((b"x-request-id", ex.request_id))
        out.append((b"x-proxy-overhead-ms", f"{ex.overhead * 1000:.3f}".encode()))
        ex.status = resp.status
        self.backlogged = self.writer.respond(resp.status, out, data)
        if ex.route.usage and resp.status == 200 and _HAS_TOKENS(data) is not None:
            ex.usage_seen.append(data)  # read when the request is accounted, after the answer
        self._finish()

    def _start_stream(self, resp: UpstreamResponse) -> None:
        ex = self.ex
        app = self.app
        self.streaming = True
        ex.stream = True
        out = self._response_headers(resp)
        out += _STREAM_HEADERS
        out.append((b"x-request-id", ex.request_id))
        ex.overhead = (self.t_sent - ex.t0) + (time.perf_counter() - self.t_in)
        out.append((b"x-proxy-overhead-ms", f"{ex.overhead * 1000:.3f}".encode()))
        ex.status = resp.status
        self.writer.start_stream(resp.status, out)
        resp.end_deadline()  # the stream's silence limit (ticks) times it from here
        config = app.config
        # Ticks every keepalive_s for the comments; with comments off (0) still one per
        # upstream_timeout_s, so the stream silence limit holds either way.
        resp.keepalive_ticks(config.keepalive_s or config.upstream_timeout_s)
        self.scan = ex.route.usage and resp.status == 200
        # Usage chunks the engine sends unasked are counted (scan), then dropped: see sse.py.
        if self.scan and not ex.wants_usage:
            self.strip = UsageChunkFilter()

    def _end_stream_with_error(self, error: UpstreamError) -> None:
        """The 200 head is gone already: end with an SSE error event and ``[DONE]`` so the
        client sees a failure, never a silently truncated stream. What the filter holds back
        (half an event) is never sent. The request is accounted as what it is (issue 22 item
        4): 502, or 504 when the engine fell silent, with the error ``engine_stream_failed``
        (the client saw a 200 head, then the error event)."""
        ex = self.ex
        self.app.metrics.upstream_errors["mid_stream"] += 1
        ex.error = "engine_stream_failed"
        ex.status = 504 if isinstance(error, UpstreamTimeout) else 502
        event = error_body(
            f"the engine stream failed before it finished: {error}", "upstream_error",
            "engine_stream_failed",
        )  # fmt: skip
        body = b"data: " + event + b"\n\ndata: [DONE]\n\n"
        if not self.at_boundary:
            body = b"\n\n" + body  # close the engine's half-sent event first
        self.writer.end_stream(body)

    def _finish(self) -> None:
        if self.done:
            return
        self.done = True
        ex = self.ex
        self.writer.on_disconnect = None
        for seen in (self.usage_prev, self.usage_last):
            if seen is not None:
                ex.usage_seen.append(seen)
        self.on_done(self)
