"""Issue 14, items 8-11: the proxy keeps its promises under slow, oversized and malformed
traffic from clients and from the engine. One regression test (or more) per item, named after
it; each failed before the fix."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable

from tests.harness.stub_engine import StubEngine
from tests.serving.conftest import (
    ALICE,
    AUTH,
    BOB,
    CHAT,
    RunningProxy,
    ScriptedEngine,
    raw_request,
    send_until_close,
    wait_until,
)

BODY = json.dumps(CHAT).encode()
# Head limits live in the HTTP server: uvicorn's httptools protocol (serving/proxy/server.py).
STREAM = {**CHAT, "stream": True}


def _status(received: bytes) -> int:
    return int(received.split(b" ", 2)[1]) if received.startswith(b"HTTP/1.") else 0


def _read_until_close(sock: socket.socket, timeout: float = 5.0) -> bytes:
    sock.settimeout(timeout)
    data = b""
    while True:
        try:
            piece = sock.recv(65536)
        except (ConnectionResetError, TimeoutError):
            return data
        if not piece:
            return data
        data += piece


# -- item 8: request heads are bounded in size and time ------------------------------------------
def test_14_8_unfinished_oversized_head_is_431_and_closed(
    start_proxy: Callable[..., RunningProxy],
) -> None:
    proxy = start_proxy(max_head_bytes=16 * 1024)
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ")
        sent = 0
        try:  # a head that never ends: the proxy must stop reading it long before 1 MiB
            while sent < 1024 * 1024:
                sock.sendall(b"a" * 8192)
                sent += 8192
        except (BrokenPipeError, ConnectionResetError):
            pass
        received = _read_until_close(sock)
    assert _status(received) == 431, received[:200]
    assert b"connection: close" in received.lower()
    assert sent < 1024 * 1024 or received  # answered, not buffered without end


def test_14_8_complete_oversized_head_is_431(start_proxy: Callable[..., RunningProxy]) -> None:
    proxy = start_proxy(max_head_bytes=4096)
    request = raw_request("GET", "/health", headers={"X-Big": "b" * 5000})
    assert _status(send_until_close(proxy.port, request)) == 431
    # a head just under the limit is served
    fits = raw_request("GET", "/health", headers={"X-Big": "b" * 3000})
    assert _status(send_until_close(proxy.port, fits)) == 200


def test_14_8_head_that_never_completes_is_408_after_the_head_timeout(
    start_proxy: Callable[..., RunningProxy],
) -> None:
    proxy = start_proxy(head_timeout_s=0.3)
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # no blank line, ever
        received = _read_until_close(sock)
    assert _status(received) == 408, received
    # a connection that never sends a byte is closed too (no slot held forever)
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as sock:
        assert _read_until_close(sock) == b""


def test_14_8_head_timeout_does_not_cut_a_keepalive_connection_or_a_stream(
    start_proxy: Callable[..., RunningProxy],
) -> None:
    proxy = start_proxy(head_timeout_s=0.2, keepalive_s=0.05)
    held = {**STREAM, "stub": {"fail": "pause", "fail_after_tokens": 1, "pause_s": 0.6}}
    with proxy.client(headers=AUTH) as c:
        raw = c.post("/v1/chat/completions", json=held).content  # lasts 3 head timeouts
        assert raw.endswith(b"data: [DONE]\n\n")
        time.sleep(0.5)  # idle between requests: keep-alive, not the head timeout, applies
        assert c.get("/health").status_code == 200


def test_14_8_slow_body_is_408_after_the_body_timeout(
    start_proxy: Callable[..., RunningProxy], stub_engine: StubEngine
) -> None:
    proxy = start_proxy(body_timeout_s=0.3)
    head = raw_request("POST", "/v1/chat/completions", body=BODY, headers=AUTH)
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as sock:
        sock.sendall(head[: len(head) - len(BODY) + 5])  # the head and 5 body bytes
        received = _read_until_close(sock)
    assert _status(received) == 408, received
    assert b'"request_timeout"' in received and b"connection: close" in received.lower()
    assert stub_engine.requests() == []
    assert proxy.app.metrics.requests[("chat_completions", "408", "alice")] == 1


# -- item 9: a slow body holds no in-flight slot -------------------------------------------------
def test_14_9_slow_bodies_do_not_hold_in_flight_slots(
    start_proxy: Callable[..., RunningProxy],
) -> None:
    proxy = start_proxy(max_in_flight=1, body_timeout_s=30)
    head = raw_request("POST", "/v1/chat/completions", body=BODY, headers=AUTH)
    slow = [socket.create_connection(("127.0.0.1", proxy.port), timeout=5) for _ in range(3)]
    try:
        for sock in slow:
            sock.sendall(head[: len(head) - 3])  # all but the last 3 body bytes
        time.sleep(0.1)
        assert proxy.app.metrics.in_flight == 0
        with proxy.client(headers=AUTH) as c:
            assert c.post("/v1/chat/completions", json=CHAT).status_code == 200
        # the slow ones finish their bodies and are served too
        for sock in slow:
            sock.sendall(head[len(head) - 3 :])
            assert _status(_read_until_close(sock)) in (200, 429)
    finally:
        for sock in slow:
            sock.close()


# -- item 10: a malformed engine head is a 502, counted as one -----------------------------------
def test_14_10_engine_header_with_bad_characters_is_502_engine_failed(
    start_proxy: Callable[..., RunningProxy], scripted_engine: Callable[..., ScriptedEngine]
) -> None:
    for bad in (b"bad name: x", b"x-nul\x00: y", b"x-cr\rx: y", b"x-val: a\x00b", b" x-fold: y"):
        engine = scripted_engine(
            answer=b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n" + bad
            + b"\r\ncontent-length: 2\r\n\r\n{}"
        )  # fmt: skip
        proxy = start_proxy(upstream=engine.url)
        with proxy.client(headers=AUTH) as c:
            r = c.post("/v1/chat/completions", json=CHAT)
        assert r.status_code == 502, (bad, r.status_code, r.content)
        assert r.json()["error"]["code"] == "engine_failed"
        assert proxy.app.metrics.requests[("chat_completions", "502", "alice")] == 1, bad
        assert proxy.app.metrics.requests[("chat_completions", "200", "alice")] == 0, bad


# -- item 11: buffers have a global cap, hop-by-hop headers stay, keepalive 0 ----------------------
def test_14_11_buffered_request_bodies_have_a_global_cap(
    start_proxy: Callable[..., RunningProxy], stub_engine: StubEngine
) -> None:
    big = {**CHAT, "user": "u" * 3000}
    body = json.dumps(big).encode()
    proxy = start_proxy(max_body_bytes=len(body), max_buffered_bytes=len(body) * 3 // 2)
    head = raw_request("POST", "/v1/chat/completions", body=body, headers=AUTH)
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as holder:
        holder.sendall(head[: len(head) - 3])  # holds len(body) - 3 of the buffer budget
        wait_until(lambda: proxy.app.buffered_bytes >= len(body) - 3, what="the body to be counted")
        # another key (within its share): the whole budget is what refuses it
        with proxy.client(headers={"Authorization": f"Bearer {BOB}"}) as c:
            r = c.post("/v1/chat/completions", json=big)
        assert r.status_code == 503, r.content
        assert r.json()["error"]["code"] == "proxy_buffers_full"
        assert r.headers["retry-after"] == "1"
        holder.sendall(head[len(head) - 3 :])
        assert _status(_read_until_close(holder)) == 200
    wait_until(lambda: proxy.app.buffered_bytes == 0, what="the budget to be given back")
    with proxy.client(headers=AUTH) as c:
        assert c.post("/v1/chat/completions", json=big).status_code == 200


def test_a_client_leaving_mid_body_gives_its_budget_back_and_is_a_499(
    start_proxy: Callable[..., RunningProxy], stub_engine: StubEngine
) -> None:
    proxy = start_proxy()
    body = json.dumps({**CHAT, "user": "u" * 3000}).encode()
    head = raw_request("POST", "/v1/chat/completions", body=body, headers=AUTH)
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as sock:
        sock.sendall(head[: len(head) - 100])
        wait_until(
            lambda: proxy.app.buffered_bytes >= len(body) - 100, what="the body to be counted"
        )
    wait_until(lambda: proxy.app.buffered_bytes == 0, what="the budget to be given back")
    wait_until(
        lambda: proxy.app.metrics.requests[("chat_completions", "499", "alice")] == 1,
        what="the request to be counted as 499",
    )
    assert proxy.app.metrics.in_flight == 0
    assert stub_engine.requests() == []


def test_14_11_buffered_response_bodies_have_a_global_cap(
    start_proxy: Callable[..., RunningProxy], scripted_engine: Callable[..., ScriptedEngine]
) -> None:
    big = b'{"x": "' + b"y" * 5000 + b'"}'
    engine = scripted_engine(
        answer=b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
        + str(len(big)).encode() + b"\r\n\r\n" + big
    )  # fmt: skip
    proxy = start_proxy(upstream=engine.url, max_body_bytes=1000, max_buffered_bytes=4000)
    with proxy.client(headers=AUTH) as c:
        r = c.post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 503, r.content
    assert r.json()["error"]["code"] == "proxy_buffers_full"
    assert proxy.app.metrics.requests[("chat_completions", "503", "alice")] == 1
    wait_until(lambda: proxy.app.buffered_bytes == 0, what="the budget to be given back")


def test_14_11_hop_by_hop_response_headers_are_dropped(
    start_proxy: Callable[..., RunningProxy], scripted_engine: Callable[..., ScriptedEngine]
) -> None:
    engine = scripted_engine(
        answer=b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nte: trailers\r\n"
        b"trailer: x-t\r\nupgrade: h2c\r\nproxy-authenticate: Basic\r\n"
        b"connection: keep-alive, X-Secret-Hop\r\nx-secret-hop: 1\r\nx-kept: 2\r\n"
        b"content-length: 2\r\n\r\n{}"
    )
    proxy = start_proxy(upstream=engine.url)
    with proxy.client(headers=AUTH) as c:
        r = c.post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 200 and r.headers["x-kept"] == "2"
    for name in ("te", "trailer", "upgrade", "proxy-authenticate", "x-secret-hop"):
        assert name not in r.headers, name


def test_14_11_request_headers_named_in_connection_are_not_forwarded(
    proxy: RunningProxy, stub_engine: StubEngine
) -> None:
    headers = {**AUTH, "Connection": "keep-alive, Traceparent", "Traceparent": "00-ab-cd-01"}
    with proxy.client(headers=headers) as c:
        assert c.post("/v1/chat/completions", json=CHAT).status_code == 200
    [record] = stub_engine.requests()
    assert "traceparent" not in record["headers"]


def test_14_11_keepalive_zero_keeps_the_stream_idle_timeout(
    start_proxy: Callable[..., RunningProxy], stub_engine: StubEngine
) -> None:
    proxy = start_proxy(keepalive_s=0, upstream_timeout_s=0.35)
    stuck = {**STREAM, "stub": {"fail": "pause", "fail_after_tokens": 1, "pause_s": 30}}
    with proxy.client(headers={"Authorization": f"Bearer {ALICE}"}, timeout=10) as c:
        raw = c.post("/v1/chat/completions", json=stuck).content
    assert b": keep-alive" not in raw  # 0 still means no comments
    assert b'"engine_stream_failed"' in raw and raw.endswith(b"data: [DONE]\n\n")
    wait_until(lambda: stub_engine.requests()[0]["cancelled"], what="the engine to see the abort")
