"""Issue 22 item 5: the edge holds clients to the serving proxy's limits.

Before: 19,995 idle unauthenticated connections exhausted the emulator's open files (and
everything stopped answering), `Content-Length: -1` made it buffer the whole connection,
`Transfer-Encoding: xchunked` got no answer and a traceback, and the log grew a traceback per
bad request. Over real sockets against a deployed `@app.server`, with the limits made small
through the `--edge-*` flags so that the test is fast: a connection cap, a head timeout, head
and body size caps, a body timeout, 400/408/413/431/501 answers that close the connection,
and at most a few log lines for many bad requests, never a traceback.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.emulator.helpers import modal_cli
from tests.emulator.runtime_support import (
    deploy_server,
    proxy_token,
    runtime_emulator,
    wait_for,
)
from tests.harness.emulator import EmulatorProcess
from tests.harness.fixtures import modal_env_for

CAP = 24
HEAD_TIMEOUT_S = 1.0
BODY_TIMEOUT_S = 2.0
MAX_BODY = 64 * 1024
LIMITS = [
    "--edge-max-connections", str(CAP),
    "--edge-head-timeout-s", str(HEAD_TIMEOUT_S),
    "--edge-body-timeout-s", str(BODY_TIMEOUT_S),
    "--edge-max-body-bytes", str(MAX_BODY),
]  # fmt: skip


@pytest.fixture(scope="module")
def edge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[EmulatorProcess, int]]:
    """An emulator with small edge limits and a deployed unauthenticated server: its port."""
    for emu in runtime_emulator(tmp_path_factory.mktemp("edge22"), extra_args=LIMITS):
        url, _ = deploy_server(emu, unauth="1", min="1")
        port = int(url.rsplit(":", 1)[1])
        answers = lambda p=port: _get(p).startswith(b"HTTP/1.1 200")  # noqa: E731
        wait_for(answers, 60, what="the server answering")
        yield emu, port


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.settimeout(10)
    return sock


def _read_all(sock: socket.socket, timeout: float = 10) -> bytes:
    """Everything until the edge closes the connection (EOF or reset)."""
    sock.settimeout(timeout)
    out = b""
    try:
        while data := sock.recv(65536):
            out += data
    except ConnectionResetError:
        pass
    return out


def _exchange(port: int, data: bytes, then: bytes = b"", wait: float = 0.0) -> bytes:
    """Send `data` (then `then` after `wait` seconds); all the edge answers until it closes."""
    with _connect(port) as sock:
        sock.sendall(data)
        if wait:
            time.sleep(wait)
        if then:
            with contextlib.suppress(OSError):  # the edge may close before all is sent
                sock.sendall(then)
        return _read_all(sock)


def _get(port: int) -> bytes:
    return _exchange(port, b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")


def _status(answer: bytes) -> int:
    assert answer.startswith(b"HTTP/1.1 "), answer[:200]
    return int(answer.split(b" ", 2)[1])


def _open_fds(pid: int) -> int:
    return len(list(Path(f"/proc/{pid}/fd").iterdir()))


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def _closed(sock: socket.socket) -> bool:
    """True when the edge has closed this idle connection (EOF or reset, nothing sent)."""
    sock.settimeout(0.05)
    try:
        data = sock.recv(1)
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True
    assert data == b"", data  # a connection that sent nothing gets no answer
    return True


def test_22_5_idle_connections_are_capped_and_closed_after_the_head_timeout(
    edge: tuple[EmulatorProcess, int],
) -> None:
    emu, port = edge
    assert emu.pid is not None
    fds_before = _open_fds(emu.pid)
    socks = [_connect(port) for _ in range(5 * CAP)]
    try:
        # The cap holds: the connections above it are closed as they are accepted...
        def capped() -> list[socket.socket] | None:
            still_open = [s for s in socks if not _closed(s)]
            return still_open if len(still_open) <= CAP else None

        open_now = wait_for(capped, 5, what=f"at most {CAP} connections left open") or []
        assert _open_fds(emu.pid) <= fds_before + CAP + 4
        # ...and the rest of the emulator keeps answering meanwhile.
        assert emu.state()["apps"]
        assert "rt-server" in modal_cli(emu, "app", "list", "--json").stdout
        # A connection that sends nothing is closed silently after the head timeout.
        wait_for(
            lambda: all(_closed(s) for s in open_now), 3 * HEAD_TIMEOUT_S + 2, what="idle closes"
        )
    finally:
        for s in socks:
            s.close()
    assert _status(_get(port)) == 200


@pytest.mark.parametrize(
    ("request_bytes", "status", "why"),
    [
        (b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\nabc", 400, "Content-Length"),
        (b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\nabc", 400,
         "Content-Length"),
        (b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n",
         400, "Transfer-Encoding"),
        (b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: xchunked\r\n\r\nabc", 501, "xchunked"),
        (b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com\r\n\r\n", 501, "CONNECT"),
        (b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 40_000 + b"\r\n\r\n", 431, "head"),
        (b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10485760\r\n\r\n", 413, "limit"),
        (b"GET / HTTP/1.1\r\nX: a\x00b\r\n\r\n", 400, "malformed"),
        (b"NOT-HTTP\r\n\r\n", 400, "malformed"),
    ],
)  # fmt: skip
def test_22_5_bad_requests_are_answered_and_closed(
    edge: tuple[EmulatorProcess, int], request_bytes: bytes, status: int, why: str
) -> None:
    _, port = edge
    answer = _exchange(port, request_bytes)
    assert _status(answer) == status, answer[:300]
    assert b"connection: close" in answer.lower()
    assert why.lower().encode() in answer.lower(), answer
    assert _status(_get(port)) == 200  # the edge is fine


def test_22_5_a_chunked_body_over_the_limit_is_413(edge: tuple[EmulatorProcess, int]) -> None:
    """A chunked body is counted as it arrives (no length to refuse up front): 413 as soon as
    it passes the limit, while the container (sleeping 3 s, not reading) has not answered."""
    _, port = edge
    head = b"GET /sleep?s=3 HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    piece = b"%x\r\n%s\r\n" % (16 * 1024, b"z" * 16 * 1024)
    started = time.monotonic()
    answer = _exchange(port, head + piece * (MAX_BODY // (16 * 1024) + 2))
    assert _status(answer) == 413, answer[:300]
    assert time.monotonic() - started < 2.5


def test_22_5_slow_heads_and_bodies_get_408(edge: tuple[EmulatorProcess, int]) -> None:
    _, port = edge
    started = time.monotonic()
    answer = _exchange(port, b"GET / HTTP/1.1\r\nHost: x\r\n")  # never finished
    assert _status(answer) == 408 and b"head" in answer
    assert time.monotonic() - started < HEAD_TIMEOUT_S + 3
    started = time.monotonic()
    body_head = b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n"
    answer = _exchange(port, body_head + b"x" * 10)  # 90 bytes never come
    assert _status(answer) == 408 and b"body" in answer
    assert time.monotonic() - started < BODY_TIMEOUT_S + 3


def test_22_5_a_negative_length_does_not_buffer_the_connection(
    edge: tuple[EmulatorProcess, int],
) -> None:
    """`Content-Length: -1` then 32 MiB: answered 400 at once, and nothing is kept."""
    emu, port = edge
    assert emu.pid is not None
    before = _rss_kib(emu.pid)
    answer = _exchange(
        port,
        b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
        then=b"x" * (32 << 20),
    )
    assert _status(answer) == 400
    assert _rss_kib(emu.pid) - before < 16 * 1024  # KiB: the 32 MiB were never held


def test_22_5_many_bad_requests_make_a_few_log_lines_and_no_traceback(
    edge: tuple[EmulatorProcess, int],
) -> None:
    emu, port = edge
    log_before = emu.stderr_path.read_text()
    for _ in range(60):
        assert _status(_exchange(port, b"GET / HTTP/1.1\r\nContent-Length: -7\r\n\r\n")) == 400
    whole = emu.stderr_path.read_text()
    new = whole[len(log_before) :]
    lines = [line for line in new.splitlines() if ": 400 " in line]
    assert len(lines) <= 6, new  # at most 5 per 10 s, then one line counting the rest
    assert "edge: http://127.0.0.1:" in whole and ": 400 malformed request" in whole
    assert "Traceback" not in whole


def test_22_5_keep_alive_and_pipelining_still_work(edge: tuple[EmulatorProcess, int]) -> None:
    _, port = edge
    two = (
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"
        b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello"
    )
    answer = _exchange(port, two)
    assert answer.count(b"HTTP/1.1 200") == 2, answer
    assert answer.endswith(b"hello")


# ---- issue 32 item 14: connections without credentials cannot hold the edge's capacity ----
# Before: `--edge-max-connections` counted every open connection alike, so 1,024 connections
# that sent half a request head (no credentials) made the edge close every new connection as
# it was accepted: each authenticated request got a reset until the heads timed out.


@pytest.fixture(scope="module")
def authed(edge: tuple[EmulatorProcess, int]) -> tuple[int, bytes]:
    """A second deployed server that requires proxy auth (on the same edge, so under the same
    connection cap): its port, and a complete request head with valid Modal-Key/Secret."""
    emu, _ = edge
    with pytest.MonkeyPatch.context() as mp:
        modal_env_for(emu, mp)
        url, _ = deploy_server(emu, app="rt-authed", min="1")
        token = proxy_token()
    port = int(url.rsplit(":", 1)[1])
    head = (
        f"GET / HTTP/1.1\r\nHost: x\r\nModal-Key: {token[0]}\r\nModal-Secret: {token[1]}\r\n"
    ).encode()
    wait_for(
        lambda: _get_status(port, head + b"Connection: close\r\n\r\n") == 200, 60,
        what="the authenticated server answering",
    )  # fmt: skip
    return port, head


def _get_status(port: int, request: bytes) -> int:
    answer = _exchange(port, request)
    return _status(answer) if answer else 0


def _dropped(sock: socket.socket) -> bool:
    """True when the edge closed this connection without answering (EOF or reset)."""
    sock.settimeout(0.05)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def _read_response(sock: socket.socket) -> bytes:
    """One response with a Content-Length body, on a connection that stays open."""
    data = b""
    while b"\r\n\r\n" not in data:
        piece = sock.recv(65536)
        assert piece, f"the edge closed the connection: {data!r}"
        data += piece
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )  # fmt: skip
    while len(body) < length:
        piece = sock.recv(65536)
        assert piece, f"the edge closed the connection mid-body: {head + body!r}"
        body += piece
    return head + b"\r\n\r\n" + body


def test_32_14_half_heads_without_credentials_cannot_lock_out_authenticated_clients(
    authed: tuple[int, bytes],
) -> None:
    port, head = authed
    # An authenticated client already connected (keep-alive, one request answered).
    kept = _connect(port)
    kept.sendall(head + b"\r\n")
    assert _status(_read_response(kept)) == 200
    # Connections with half a request head and no credentials fill the whole cap...
    flood = [_connect(port) for _ in range(CAP)]
    try:
        for sock in flood:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        # ...yet a new authenticated request, sent at once (well within the head timeout
        # that would close those), is answered: the oldest of them made room for it.
        answer = _exchange(port, head + b"Connection: close\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 200"), answer[:300] or "no answer (closed/reset)"
        # The connection that had shown valid credentials was not the one closed.
        kept.sendall(head + b"\r\n")
        assert _status(_read_response(kept)) == 200
        # Made room by closing (resetting) half-head connections, without an answer; the
        # others are still open or were answered 408 by the head timeout.
        assert any(_dropped(s) for s in flood), "no half-head connection was closed for room"
    finally:
        kept.close()
        for sock in flood:
            sock.close()


def test_32_14_at_the_cap_the_longest_idle_keep_alive_connection_makes_room(
    authed: tuple[int, bytes],
) -> None:
    """When every open connection has shown credentials, a new one still gets in if one of
    them is idle between two requests: the longest idle is closed (nginx closes idle
    keep-alive connections the same way when out of worker_connections)."""
    port, head = authed
    idle: list[socket.socket] = []
    try:
        for _ in range(CAP):
            sock = _connect(port)
            sock.sendall(head + b"\r\n")
            assert _status(_read_response(sock)) == 200
            idle.append(sock)
        answer = _exchange(port, head + b"Connection: close\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 200"), answer[:300] or "no answer (closed/reset)"
        assert _dropped(idle[0])  # the longest idle one
        idle[-1].sendall(head + b"\r\n")  # the most recent is still served
        assert _status(_read_response(idle[-1])) == 200
    finally:
        for sock in idle:
            sock.close()
