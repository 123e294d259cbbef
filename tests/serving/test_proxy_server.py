"""The proxy's HTTP server as deployed (uvicorn with serving/proxy/server.py's protocol and
runner.py's settings): keep-alive, 100-continue, HTTP/1.0 streams (close-delimited), the
keep-alive timeout, write back-pressure, failures of the app, and graceful shutdown.
(Pipelining, framing tricks and header injection: test_proxy_http.py; head limits:
test_proxy_faults.py.)"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from serving.proxy import KeyRing, ProxyApp, ProxyConfig
from tests.harness.stub_engine import Message, Receive, Scope, Send, StubEngine, UvicornThread
from tests.serving.conftest import (
    ALICE,
    AUTH,
    CHAT,
    KEYS,
    RunningProxy,
    ScriptedEngine,
    serve_proxy,
    wait_until,
)

AUTH_LINE = f"Authorization: Bearer {ALICE}\r\n".encode()
BODY = json.dumps(CHAT).encode()
STREAM_BODY = json.dumps({**CHAT, "stream": True}).encode()


def _recv_response(sock: socket.socket, buf: bytes = b"") -> tuple[bytes, bytes, bytes]:
    """Read one Content-Length response; return (head, body, leftover)."""
    while b"\r\n\r\n" not in buf:
        piece = sock.recv(65536)
        assert piece, f"connection closed before a response head: {buf!r}"
        buf += piece
    head, _, rest = buf.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    got = bytearray(rest)
    while len(got) < length:
        piece = sock.recv(1 << 20)
        assert piece
        got += piece
    return head, bytes(got[:length]), bytes(got[length:])


def _read_all(sock: socket.socket) -> bytes:
    data = b""
    while piece := sock.recv(65536):
        data += piece
    return data


def test_keep_alive_serves_many_requests_on_one_connection(proxy: RunningProxy) -> None:
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as sock:
        for _ in range(3):
            sock.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + AUTH_LINE
                + b"Content-Length: %d\r\n\r\n" % len(BODY) + BODY
            )  # fmt: skip
            head, body, leftover = _recv_response(sock)
            assert head.startswith(b"HTTP/1.1 200 ") and b'"usage"' in body
            assert b"connection: close" not in head.lower() and leftover == b""
            assert b"\r\ndate: " in head  # like uvicorn and nginx


def test_a_non_stream_answer_has_exactly_one_content_length(proxy: RunningProxy) -> None:
    """RFC 9112 6.3: several Content-Length fields make a message invalid, and aiohttp (so
    LiteLLM) refuses the answer; the engine's own Content-Length must not be repeated."""
    for path, body in (("/v1/chat/completions", BODY), ("/v1/models", b"")):
        method = b"POST" if body else b"GET"
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as sock:
            sock.sendall(
                method + b" " + path.encode() + b" HTTP/1.1\r\nHost: x\r\n" + AUTH_LINE
                + b"Content-Length: %d\r\n\r\n" % len(body) + body
            )  # fmt: skip
            head, payload, _ = _recv_response(sock)
        lengths = [
            line for line in head.split(b"\r\n") if line.lower().startswith(b"content-length:")
        ]
        assert head.startswith(b"HTTP/1.1 200 ") and lengths == [
            b"content-length: %d" % len(payload)
        ], head


def test_100_continue_only_after_the_key_check(proxy: RunningProxy) -> None:
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n"
    length = b"Content-Length: %d\r\n\r\n" % len(BODY)
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as sock:
        sock.sendall(head + AUTH_LINE + length)
        got = sock.recv(65536)
        assert got == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(BODY)
        head_, _, _ = _recv_response(sock)
        assert head_.startswith(b"HTTP/1.1 200 ")
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as sock:
        sock.sendall(head + b"Authorization: Bearer wrong-key\r\n" + length)
        answer = _read_all(sock)  # no 100, a 403 and the connection closes
        assert answer.startswith(b"HTTP/1.1 403 ") and b"100 Continue" not in answer


def test_http_1_0_stream_is_close_delimited(proxy: RunningProxy) -> None:
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.0\r\n" + AUTH_LINE
            + b"Content-Length: %d\r\n\r\n" % len(STREAM_BODY) + STREAM_BODY
        )  # fmt: skip
        raw = _read_all(sock)
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ") and b"transfer-encoding" not in head.lower()
    assert b"connection: close" in head.lower()
    assert body.startswith(b"data: {") and body.endswith(b"data: [DONE]\n\n")


def test_head_request_gets_no_body(proxy: RunningProxy) -> None:
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as sock:
        sock.sendall(b"HEAD /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        raw = _read_all(sock)
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 405 ") and b"content-length: " in head and body == b""


@pytest.fixture
def server_of(stub_engine: StubEngine) -> Iterator[Callable[..., UvicornThread]]:
    """The proxy app (or ``app``) served as deployed, with some of uvicorn's settings and the
    proxy's head timeout changed for the test."""
    made: list[UvicornThread] = []

    def make(
        app: object | None = None, head_timeout_s: float = 10.0, **uvicorn: Any
    ) -> UvicornThread:
        config = ProxyConfig(
            upstream=stub_engine.url, health_interval_s=0.05, head_timeout_s=head_timeout_s
        )
        proxy_app = ProxyApp(config, KeyRing(KEYS))
        if app is not None:
            uvicorn.setdefault("lifespan", "off")  # a bare test app has no lifespan
        server = serve_proxy(app or proxy_app, config, **uvicorn)
        made.append(server)
        wait_until(lambda: proxy_app.ready if app is None else True, what="readiness")
        return server

    yield make
    for server in made:
        server.stop()


def test_idle_keep_alive_connection_is_closed_after_the_keepalive_timeout(
    server_of: Callable[..., UvicornThread],
) -> None:
    server = server_of(timeout_keep_alive=0.3, head_timeout_s=0.2)
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        head, _, _ = _recv_response(sock)
        assert head.startswith(b"HTTP/1.1 200 ")
        t0 = time.monotonic()
        assert sock.recv(100) == b""  # closed by the server, with nothing sent
        assert time.monotonic() - t0 >= 0.25


def test_a_client_that_reads_slowly_gets_a_large_body_intact(
    start_proxy: Callable[..., RunningProxy], scripted_engine: Callable[..., ScriptedEngine]
) -> None:
    # 4 MiB in one write: far over the socket's buffers, so the server must wait for the
    # client (write back-pressure) and still deliver every byte.
    big = b'{"x": "' + bytes(range(97, 123)) * (4 * 1024 * 1024 // 26) + b'"}'
    engine = scripted_engine(
        answer=b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
        + str(len(big)).encode() + b"\r\n\r\n" + big
    )  # fmt: skip
    proxy = start_proxy(upstream=engine.url)
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + AUTH_LINE
            + b"Content-Length: %d\r\n\r\n" % len(BODY) + BODY
        )  # fmt: skip
        time.sleep(0.3)
        head, body, _ = _recv_response(sock)
        assert head.startswith(b"HTTP/1.1 200 ") and body == big
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")  # still usable after
        assert _recv_response(sock)[0].startswith(b"HTTP/1.1 200 ")


def test_a_client_that_reads_a_stream_slowly_gets_every_event(
    start_proxy: Callable[..., RunningProxy], scripted_engine: Callable[..., ScriptedEngine]
) -> None:
    # 64 events of 64 KiB, all at once: the client's socket fills, so the relay must stop
    # reading the engine until it drains, then go on, without losing or reordering a byte.
    events = [b"data: " + (b"%02d" % i) * 32768 + b"\n\n" for i in range(64)]
    chunks = b"".join(b"%x\r\n%b\r\n" % (len(e), e) for e in events) + b"0\r\n\r\n"
    engine = scripted_engine(
        answer=b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
        b"transfer-encoding: chunked\r\n\r\n" + chunks
    )
    proxy = start_proxy(upstream=engine.url)
    stream = json.dumps({**CHAT, "stream": True, "stream_options": {"include_usage": True}})
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            + AUTH_LINE + b"Content-Length: %d\r\n\r\n" % len(stream) + stream.encode()
        )  # fmt: skip
        time.sleep(0.3)
        raw = bytearray()
        while piece := sock.recv(1 << 20):
            raw += piece
    head, _, body = bytes(raw).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ")
    assert _dechunk(body) == b"".join(events)


def _dechunk(data: bytes) -> bytes:
    out = b""
    while True:
        size_line, _, data = data.partition(b"\r\n")
        size = int(size_line, 16)
        if size == 0:
            assert data == b"\r\n", "no clean end of the chunked body"
            return out
        out += data[:size]
        assert data[size : size + 2] == b"\r\n"
        data = data[size + 2 :]


class _Boom:
    """An app that fails before answering, or after the response head."""

    def __init__(self, when: str) -> None:
        self.when = when

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.when == "after_head":
            start: Message = {"type": "http.response.start", "status": 200, "headers": []}
            await send(start)
            await send({"type": "http.response.body", "body": b"partial", "more_body": True})
        raise RuntimeError("simulated bug")


@pytest.mark.parametrize("when", ["before_head", "after_head"])
def test_an_app_failure_is_a_500_or_a_cut_connection_never_a_clean_end(
    server_of: Callable[..., UvicornThread], when: str
) -> None:
    server = server_of(app=_Boom(when))
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        raw = _read_all(sock)
    if when == "before_head":
        assert raw.startswith(b"HTTP/1.1 500 ") and b"connection: close" in raw
    else:
        assert raw.startswith(b"HTTP/1.1 200 ") and not raw.endswith(b"0\r\n\r\n")


def test_graceful_shutdown_lets_a_stream_finish_and_refuses_new_connections(
    stub_engine: StubEngine,
) -> None:
    app = ProxyApp(ProxyConfig(upstream=stub_engine.url, health_interval_s=0.05), KeyRing(KEYS))
    server = serve_proxy(app, app.config, timeout_graceful_shutdown=5)
    try:
        wait_until(lambda: app.ready, what="readiness")
        slow = {**CHAT, "stream": True, "stub": {"tokens": 10, "token_delay_ms": 50}}
        with (
            httpx.Client(base_url=server.url, headers=AUTH, timeout=10) as c,
            c.stream("POST", "/v1/chat/completions", json=slow) as r,
        ):
            reader = r.iter_raw()
            got = next(reader)
            stopper = threading.Thread(target=server.stop)
            stopper.start()
            for piece in reader:
                got += piece
            stopper.join()
        assert got.endswith(b"data: [DONE]\n\n") and got.count(b"tok") == 10
        with pytest.raises(httpx.ConnectError):
            httpx.get(server.url + "/health", timeout=2)
    finally:
        server.stop()


def test_stream_relay_keepalives_and_client_leaving(
    start_proxy: Callable[..., RunningProxy], stub_engine: StubEngine
) -> None:
    # The relay runs in the engine connection's callbacks and writes through the ASGI
    # coroutine: every event is sent, keep-alives at event boundaries only, and the engine
    # request is aborted when the client leaves.
    proxy = start_proxy(keepalive_s=0.1)
    quiet = {**CHAT, "stream": True, "stub": {"fail": "pause", "fail_after_tokens": 2,
                                               "pause_s": 0.35}}  # fmt: skip
    with proxy.client(headers=AUTH) as c:
        raw = c.post("/v1/chat/completions", json=quiet).content
    events = [e for e in raw.split(b"\n\n") if e]
    assert b": keep-alive" in events and events[-1] == b"data: [DONE]"
    texts = [json.loads(e[6:])["choices"][0]["delta"]["content"] for e in events
             if e.startswith(b"data: {")]  # fmt: skip
    assert texts == ["tok0 ", "tok1 ", "tok2 ", "tok3 "]
    stub_engine.reset()
    slow = {**CHAT, "stream": True, "stub": {"tokens": 500, "token_delay_ms": 20}}
    with proxy.client(headers=AUTH) as c, c.stream("POST", "/v1/chat/completions", json=slow) as r:
        next(r.iter_raw())
    wait_until(lambda: stub_engine.requests()[0]["cancelled"], what="the engine to see the abort")
    wait_until(lambda: proxy.app.metrics.in_flight == 0, what="in-flight to drain")
