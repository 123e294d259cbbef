"""An answer given before the request body arrived survives the connection's close.

The proxy answers 401/403/404/413/429 without reading the body the client announced, and
closes the connection (`Connection: close`) so it never has to read a large body. Closing a
socket that still receives data makes the kernel answer with RST, and an RST destroys what
the client had not read yet: the answer. Through the emulator's edge this lost ~1 answer in
70 under load (the edge sends head and body as two writes): the client saw the 401's head
and then `IncompleteRead(0 bytes read, 128 more expected)`.

The proxy's HTTP protocol (serving/proxy/server.py) closes like nginx's lingering_close: FIN
after the answer, then it reads and drops what the client still sends until the client closes
or LINGER_S passes.
"""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable

import pytest

from serving.proxy.server import LINGER_S
from tests.serving.conftest import RunningProxy


def _read_answer(sock: socket.socket) -> tuple[bytes, bytes]:
    """(head, body) of one response framed by Content-Length."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed before the answer's head: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed inside the answer's body: {body!r}"
        body += chunk
    return head, body


@pytest.mark.parametrize(
    ("auth", "status"),
    [(None, 401), (b"Bearer sk-not-a-key", 403)],
    ids=["no-key", "wrong-key"],
)
def test_an_early_answer_is_read_whole_though_the_body_keeps_coming(
    start_proxy: Callable[..., RunningProxy], auth: bytes | None, status: int
) -> None:
    proxy = start_proxy()
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 100000\r\n"
    )
    if auth is not None:
        head += b"Authorization: " + auth + b"\r\n"
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock:
        sock.sendall(head + b"\r\n")
        # The body keeps arriving while the proxy answers from the head alone and ends the
        # connection: a socket closed with unread bytes would answer RST, and the client's
        # read of the answer below would fail (ConnectionResetError) or come up short.
        for _ in range(50):
            sock.sendall(b" " * 200)
            time.sleep(0.005)
        answer_head, body = _read_answer(sock)
    assert answer_head.startswith(b"HTTP/1.1 %d " % status), answer_head
    assert b"connection: close" in answer_head.lower()
    assert json.loads(body)["error"]["code"]


def test_a_client_that_keeps_sending_is_cut_after_the_linger_time(
    start_proxy: Callable[..., RunningProxy],
) -> None:
    """Lingering is bounded: a client announcing a huge body and sending it forever gets the
    answer, then the connection ends within LINGER_S (plus a sweep), not when it stops."""
    proxy = start_proxy()
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 1000000000\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=10) as sock:
        sock.sendall(head)
        started = time.monotonic()
        answer = b""
        ended = False
        while time.monotonic() - started < LINGER_S + 5:
            try:
                sock.sendall(b"x" * 65536)
            except (BrokenPipeError, ConnectionResetError):
                ended = True
                break
            sock.setblocking(False)
            try:
                chunk = sock.recv(65536)
                if chunk:
                    answer += chunk
            except BlockingIOError:
                pass
            finally:
                sock.setblocking(True)
            time.sleep(0.01)
    assert answer.startswith(b"HTTP/1.1 401 "), answer[:100]
    assert ended, "the proxy kept reading a body it had refused"
