"""Issue 22, items 1-4: no single client exhausts the proxy. One test (or more) per item, named
after it, over real sockets against the real proxy as deployed (on uvicorn with the proxy's
HTTP protocol); each failed on the code before the fix (see the commit that added it)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import httpx
import pytest

from serving.proxy import ProxyConfig
from serving.proxy.__main__ import build_parser
from serving.proxy.server import MAX_PIPELINE
from serving.proxy.upstream import UpstreamBroken, UpstreamClient, UpstreamResponse, _Conn
from tests.harness.stub_engine import PROJECT_ROOT, StubEngine, StubEngineProcess
from tests.serving.conftest import (
    ALICE,
    AUTH,
    BOB,
    CHAT,
    KEYS,
    RunningProxy,
    ScriptedEngine,
    raw_request,
    send_until_close,
    wait_until,
)

ALICE_LINE = f"Authorization: Bearer {ALICE}\r\n".encode()
BODY = json.dumps(CHAT).encode()


def _status(received: bytes) -> int:
    return int(received.split(b" ", 2)[1]) if received.startswith(b"HTTP/1.") else 0


def _read_responses(sock: socket.socket, count: int) -> list[tuple[bytes, int]]:
    """Read ``count`` Content-Length responses (fewer if the server closes): (head, body size)."""
    got: list[tuple[bytes, int]] = []
    buf = b""
    while len(got) < count:
        while b"\r\n\r\n" not in buf:
            piece = sock.recv(1 << 20)
            if not piece:
                return got
            buf += piece
        head, _, buf = buf.partition(b"\r\n\r\n")
        length = next(
            int(line.split(b":", 1)[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        while len(buf) < length:
            piece = sock.recv(1 << 20)
            assert piece, "connection closed inside a body"
            buf += piece
        got.append((head, length))
        buf = buf[length:]
    return got


def _kernel_send_buffer_max() -> int:
    try:
        with open("/proc/sys/net/ipv4/tcp_wmem") as f:
            return int(f.read().split()[2])
    except (OSError, ValueError, IndexError):
        return 4 * 1024 * 1024


def _settled(count: Callable[[], int], ceiling: int, quiet_s: float = 0.4) -> int:
    """Wait until ``count()`` reaches ``ceiling`` or stops changing for ``quiet_s``; its value.
    (Synchronisation, not a timed assertion: a proxy still progressing slowly only makes the
    test wait longer.)"""
    deadline = time.monotonic() + 20
    last, since = count(), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.05)
        now = count()
        if now >= ceiling:
            return now
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return now
    return count()


# -- item 1: a client that pipelines and never reads ----------------------------------------------
def test_22_1_unread_pipelining_is_bounded(
    start_proxy: Callable[..., RunningProxy],
    scripted_engine: Callable[..., ScriptedEngine],
) -> None:
    """Each answer is 1 MiB (or more); the client pipelines MAX_PIPELINE + 1 requests (the most a
    connection may queue) and reads nothing. The kernel's socket buffers take a few answers;
    after that the proxy must stop serving (it used to serve them all into its own write
    buffer: 33 -> 1,245 MB on 20 connections). Once the client reads, every answer comes."""
    # Answers large enough that the kernel's socket buffers (the sender's grow up to
    # tcp_wmem's maximum) hold only a few of them, whatever the machine's setting.
    answer_body = b"x" * max(1024 * 1024, _kernel_send_buffer_max() // 4)
    engine = scripted_engine(
        answer=b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
        % len(answer_body) + answer_body
    )  # fmt: skip
    proxy = start_proxy(upstream=engine.url)
    n = MAX_PIPELINE + 1
    request = b"GET /v1/models HTTP/1.1\r\nHost: x\r\n" + ALICE_LINE + b"\r\n"
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the client's window: tiny
    try:
        sock.settimeout(10)
        sock.connect(("127.0.0.1", proxy.port))
        sock.sendall(request * n)
        served = _settled(lambda: len(engine.requests), n)
        # What the kernel holds (a few MiB on loopback) plus one answer in the proxy's
        # buffer and, on uvicorn, one more request sent before its answer waits to be sent.
        assert served < n - 4, f"{served} of {n} answered while the client read nothing"
        # the answer waiting in the proxy's buffer is still in its buffer budget
        assert proxy.app.buffered_bytes >= len(answer_body)
        answers = _read_responses(sock, n)
    finally:
        sock.close()
    assert len(answers) == n
    assert all(head.startswith(b"HTTP/1.1 200 ") and size == len(answer_body)
               for head, size in answers)  # fmt: skip
    assert len(engine.requests) == n
    wait_until(lambda: proxy.app.buffered_bytes == 0, what="the answers' budget to be given back")


def test_22_1_read_ahead_is_capped_per_connection(start_proxy: Callable[..., RunningProxy]) -> None:
    """Requests pipelined in one burst are queued up to MAX_PIPELINE behind the one being
    served; the queued ones are answered, then the connection closes (the client retries the
    rest, RFC 9112 9.3.2). Before, a single read could queue thousands of requests."""
    proxy = start_proxy()
    request = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock:
        sock.sendall(request * (MAX_PIPELINE * 4))
        answers = _read_responses(sock, MAX_PIPELINE * 4)
        sock.settimeout(5)
        assert sock.recv(1) == b""  # closed after the last queued answer
    assert len(answers) == MAX_PIPELINE + 1
    assert all(head.startswith(b"HTTP/1.1 200 ") for head, _ in answers)
    assert b"connection: close" in answers[-1][0].lower()


# -- item 2: one key's uploads never lock out another key -----------------------------------------
def test_22_2_announced_bodies_reserve_nothing_and_keys_get_a_fair_share(
    start_proxy: Callable[..., RunningProxy], stub_engine: StubEngine
) -> None:
    """Budget 32 KiB, bodies up to 8 KiB, two keys: each key's share is 16 KiB."""
    proxy = start_proxy(max_body_bytes=8192, max_buffered_bytes=32768)
    bob = {"Authorization": f"Bearer {BOB}"}
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + ALICE_LINE
        + b"Content-Type: application/json\r\nContent-Length: 8192\r\n\r\n"
    )  # fmt: skip
    # Alice announces the largest body on 6 connections (48 KiB, more than the whole budget)
    # and sends one byte on each: that reserved the whole budget, and every key got 503.
    holders = [socket.create_connection(("127.0.0.1", proxy.port), timeout=10) for _ in range(6)]
    try:
        for sock in holders:
            sock.sendall(head + b"{")
        wait_until(lambda: proxy.app.buffered_bytes >= 6, what="alice's bytes to be counted")
        with proxy.client(headers=bob) as c:
            assert c.post("/v1/chat/completions", json=CHAT).status_code == 200
        assert proxy.app.key_share == 16384 and proxy.app.key_held["alice"] == 6
        # Alice now sends real bytes: 5 KiB more on each. Past her 16 KiB share her
        # uploads are refused (503) while the budget still has room for Bob.
        refused = 0
        for sock in holders:
            try:
                sock.sendall(b" " * 5000)
            except OSError:
                refused += 1
        wait_until(
            lambda: proxy.app.metrics.requests[("chat_completions", "503", "alice")] >= 3,
            what="alice's uploads past her share to be refused",
        )
        assert proxy.app.key_held["alice"] <= proxy.app.key_share
        big = {**CHAT, "user": "u" * 6000}  # Bob uploads as much: his share is untouched
        with proxy.client(headers=bob) as c:
            assert c.post("/v1/chat/completions", json=big).status_code == 200
        with proxy.client(headers=AUTH) as c:
            r = c.post("/v1/chat/completions", json=big)
        assert r.status_code == 503 and r.json()["error"]["code"] == "proxy_buffers_full"
        assert "this key's share" in r.json()["error"]["message"]
    finally:
        for sock in holders:
            sock.close()
    wait_until(lambda: proxy.app.buffered_bytes == 0, what="the budget to be given back")
    assert proxy.app.key_held["alice"] == 0 and proxy.app.key_held["bob"] == 0
    assert [r["path"] for r in stub_engine.requests()] == ["/v1/chat/completions"] * 2


# -- item 3: the engine is timed until its whole answer is in -------------------------------------
def test_22_3_stalled_non_stream_body_times_out_and_frees_the_slot(
    start_proxy: Callable[..., RunningProxy],
    scripted_engine: Callable[..., ScriptedEngine],
) -> None:
    engine = scripted_engine(
        answer=b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 100\r\n"
        b'\r\n{"id": "x",'  # then nothing, ever
    )
    proxy = start_proxy(upstream=engine.url, upstream_timeout_s=0.5)
    with proxy.client(headers=AUTH, timeout=10) as c:
        r = c.post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 504, r.content
    assert r.json()["error"]["code"] == "engine_timeout"
    assert "whole answer" in r.json()["error"]["message"]
    wait_until(lambda: proxy.app.metrics.in_flight == 0, what="the in-flight slot to be freed")
    wait_until(  # the stalled engine connection is closed; only pooled idle ones stay
        lambda: engine.open == proxy.app.client.idle_connections,
        what="the engine connection to be closed",
    )
    assert proxy.app.metrics.upstream_errors["timeout"] == 1


def test_22_3_engine_head_over_64_kib_in_one_read_is_502(
    start_proxy: Callable[..., RunningProxy], scripted_engine: Callable[..., ScriptedEngine]
) -> None:
    big_head = b"HTTP/1.1 200 OK\r\nx-big: " + b"b" * 70_000 + b"\r\ncontent-length: 2\r\n\r\n{}"
    proxy = start_proxy(upstream=scripted_engine(answer=big_head).url)
    with proxy.client(headers=AUTH) as c:
        r = c.post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 502, (r.status_code, r.content[:200])
    assert "64 KiB" in r.json()["error"]["message"]


def test_22_3_engine_head_over_64_kib_is_refused_whatever_the_read() -> None:
    """The parser on its own: one whole 70 KB head handed over in one read (the socket test
    above cannot force the kernel to deliver it in one piece)."""
    big_head = b"HTTP/1.1 200 OK\r\nx-big: " + b"b" * 70_000 + b"\r\ncontent-length: 2\r\n\r\n{}"

    class Transport:
        def abort(self) -> None:
            pass

    loop = asyncio.new_event_loop()
    try:
        conn = _Conn(UpstreamClient("http://127.0.0.1:9"))
        conn.transport = Transport()  # type: ignore[assignment]
        resp = UpstreamResponse(conn, loop)
        conn.start(resp, head_only=False)
        conn.data_received(big_head)
        assert resp.finished and resp.status == 0
        with pytest.raises(UpstreamBroken, match="64 KiB"):
            loop.run_until_complete(resp.head())
    finally:
        loop.close()


def test_22_3_engine_101_is_refused_at_once(
    start_proxy: Callable[..., RunningProxy], scripted_engine: Callable[..., ScriptedEngine]
) -> None:
    engine = scripted_engine(
        answer=b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: upgrade"
        b"\r\n\r\n"
    )
    # 30 s to answer; the client gives up after 5: a 502 must come at once, not a 504 at 30.
    proxy = start_proxy(upstream=engine.url, upstream_timeout_s=30)
    with proxy.client(headers=AUTH, timeout=5) as c:
        r = c.post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 502
    assert "101" in r.json()["error"]["message"]
    wait_until(lambda: proxy.app.metrics.in_flight == 0, what="the in-flight slot to be freed")


# -- item 4: the budget holds, GET bodies, broken streams -----------------------------------------
def _rss_kib(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise AssertionError(f"{field} not in /proc/{pid}/status")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/PID/status")
def test_22_4_slow_large_bodies_stay_within_the_buffer_budget() -> None:
    """A proxy process with a 32 MiB budget takes 24 bodies of 2 MiB (48 MiB), each sent in
    64 KiB pieces, their last bytes all at once. Its peak memory (VmHWM) may grow by the
    budget and some slack, not by twice the budget: bodies were joined from their pieces (both
    held at once) and the pieces' heap memory was never given back (64 slow 4 MiB bodies: 518
    MB against 256 MiB)."""
    budget = 32 * 1024 * 1024
    size = 2 * 1024 * 1024
    body = b'{"model":"m","messages":[{"role":"user","content":"' + b"x" * (size - 80) + b'"}]}'
    body += b" " * (size - len(body))
    head = raw_request("POST", "/v1/chat/completions", body=body, headers=AUTH)[: -len(body)]
    with StubEngineProcess(tokens=1) as engine:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        env = {**os.environ, "SERVING_API_KEYS": json.dumps(KEYS)}
        proc = subprocess.Popen(
            [sys.executable, "-m", "serving.proxy", "--upstream", engine.url, "--port", str(port),
             "--host", "127.0.0.1", "--no-access-log", "--max-body-bytes", str(size),
             "--max-buffered-bytes", str(budget)],
            cwd=PROJECT_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            url = f"http://127.0.0.1:{port}"

            def ready() -> bool:
                try:
                    return httpx.get(url + "/ready", timeout=1).status_code == 200
                except httpx.TransportError:
                    return False

            wait_until(ready, timeout=20, what="the proxy subprocess to be ready")
            for _ in range(2):  # warm up: the body check's buffers, the pool, the allocator
                assert send_until_close(port, head + body, timeout=20).startswith(b"HTTP/1.1 200")
            before = _rss_kib(proc.pid, "VmRSS")
            statuses: list[int] = []
            all_but_one = threading.Barrier(24)

            def upload() -> None:
                with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
                    try:
                        sock.sendall(head)
                        for i in range(0, size - 1, 65536):
                            sock.sendall(body[i : min(i + 65536, size - 1)])
                            time.sleep(0.002)
                    except OSError:  # refused (503) and closed while sending
                        pass
                    all_but_one.wait()  # the last bytes of every body arrive together
                    with contextlib.suppress(OSError):
                        sock.sendall(body[-1:])
                    statuses.append(_status(sock.recv(64)))

            threads = [threading.Thread(target=upload) for _ in range(24)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            peak = _rss_kib(proc.pid, "VmHWM")
        finally:
            proc.terminate()
            proc.wait(timeout=15)
    assert len(statuses) == 24 and set(statuses) <= {200, 503}, statuses
    grew_mib = (peak - before) / 1024
    assert grew_mib < 32 * 1.4, f"peak memory grew by {grew_mib:.0f} MiB for a 32 MiB budget"


def test_22_4_a_get_body_is_refused_and_never_forwarded(
    start_proxy: Callable[..., RunningProxy], stub_engine: StubEngine
) -> None:
    proxy = start_proxy()
    for body in (b'{"model": "m"}', b"not json at all"):
        request = raw_request("GET", "/v1/models", body=body, headers=AUTH)
        received = send_until_close(proxy.port, request)
        assert _status(received) == 400, received[:200]
        assert b'"unexpected_body"' in received and b"connection: close" in received.lower()
    assert stub_engine.requests() == []
    # without a body (or an empty one) it is served as always
    assert _status(send_until_close(proxy.port, raw_request("GET", "/v1/models", headers={
        **AUTH, "Content-Length": "0"}))) == 200  # fmt: skip
    with proxy.client(headers=AUTH) as c:
        assert c.get("/v1/models").status_code == 200
    assert [r["body"] for r in stub_engine.requests()] == ["", ""]


def test_22_4_a_stream_broken_midway_is_counted_as_a_502(
    start_proxy: Callable[..., RunningProxy],
    stub_engine: StubEngine,
    caplog: pytest.LogCaptureFixture,
) -> None:
    proxy = start_proxy()
    dying = {**CHAT, "stream": True, "stub": {"fail": "die_mid_stream", "fail_after_tokens": 2}}
    with caplog.at_level("INFO", logger="serving.proxy.access"):
        with proxy.client(headers=AUTH) as c:
            r = c.post("/v1/chat/completions", json=dying)
        assert r.status_code == 200  # the head went out before the engine failed
        assert b'"engine_stream_failed"' in r.content
        wait_until(lambda: proxy.app.metrics.in_flight == 0, what="the request to end")
        wait_until(lambda: any('"status":502' in m for m in caplog.messages), what="the log")
    requests = proxy.app.metrics.requests
    assert requests[("chat_completions", "502", "alice")] == 1
    assert requests[("chat_completions", "200", "alice")] == 0
    assert b'proxy_requests_total{route="chat_completions",status="502",key="alice"} 1' in (
        proxy.app.metrics.render()
    )
    [line] = [json.loads(m) for m in caplog.messages if '"route":"chat_completions"' in m]
    assert line["status"] == 502 and line["error"] == "engine_stream_failed"


# -- issue 24 item 4 (CPU part): engine connections kept and ramped --------------------------------
def test_24_4_idle_engine_connections_are_kept_for_upstream_idle_s(
    start_proxy: Callable[..., RunningProxy], scripted_engine: Callable[..., ScriptedEngine]
) -> None:
    """The pool keeps an idle engine connection for ``--upstream-idle-s`` (default 60 s; it
    was a fixed 4 s, so every burst after a pause opened new connections)."""
    assert ProxyConfig(upstream="http://127.0.0.1:1").upstream_idle_s == 60
    args = build_parser().parse_args(["--upstream", "http://x:1", "--port", "1"])
    assert args.upstream_idle_s == 60
    answer = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}"
    for idle_s, new_connections in ((0.2, 1), (60, 0)):
        engine = scripted_engine(answer=answer)
        # one /health poll at start, none after: nothing else touches the pool
        proxy = start_proxy(upstream=engine.url, upstream_idle_s=idle_s, health_interval_s=60)
        assert proxy.app.client.idle_ttl_s == idle_s
        with proxy.client(headers=AUTH) as c:
            assert c.post("/v1/chat/completions", json=CHAT).status_code == 200
            before = engine.accepted
            time.sleep(0.5)  # longer than the short idle lifetime
            assert c.post("/v1/chat/completions", json=CHAT).status_code == 200
        assert engine.accepted - before == new_connections, (idle_s, engine.accepted, before)


def test_24_4_new_engine_connections_ramp_up(
    start_proxy: Callable[..., RunningProxy], stub_engine: StubEngine
) -> None:
    """A burst that finds no idle engine connection makes at most
    ``--upstream-max-connecting`` new ones at once; the rest wait for a slot (or a connection
    given back), and every request is served."""
    proxy = start_proxy(upstream_max_connecting=2)
    client = proxy.app.client
    client.close()  # no idle connection: every request of the burst needs a new one
    real_connect = client._connect
    connecting = peak = made = 0

    async def slow_connect(loop: asyncio.AbstractEventLoop) -> _Conn:  # a busy engine
        nonlocal connecting, peak, made
        connecting += 1
        made += 1
        peak = max(peak, connecting)
        try:
            await asyncio.sleep(0.05)
            return await real_connect(loop)
        finally:
            connecting -= 1

    client._connect = slow_connect  # type: ignore[method-assign]
    slow = {**CHAT, "stub": {"first_token_delay_ms": 300}}
    statuses: list[int] = []

    def one() -> None:
        with proxy.client(headers=AUTH) as c:
            statuses.append(c.post("/v1/chat/completions", json=slow).status_code)

    threads = [threading.Thread(target=one) for _ in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert statuses == [200] * 12
    assert peak <= 2, f"{peak} engine connections were being made at once"
    assert made <= 13  # one per request at most (and maybe one for a /health poll)
