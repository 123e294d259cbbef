"""Fixtures for the serving proxy tests: a stub engine and the real proxy on loopback ports.

- ``stub_engine``: a fresh ``StubEngine`` (tests/harness/stub_engine.py) in a uvicorn thread.
- ``start_proxy(**config)``: the real ``ProxyApp`` served as deployed (uvicorn with the
  proxy's settings and head limits: ``serve_proxy``) in a thread in front of ``stub_engine``;
  waits until the proxy reports the engine ready (``wait_ready=False`` skips).
- ``proxy``: ``start_proxy()`` with the defaults the tests share.
- ``raw_http(port, request_bytes)``: send bytes as-is over a socket (path tricks must not be
  normalised by a client library) and parse the response.
- ``ScriptedEngine(answer)``: a bare socket server for engine misbehaviour the stub (a real
  ASGI app) cannot produce, e.g. closing the connection before any response byte.

Keys: ``alice`` → ``sk-alice-0123456789``, ``bob`` → ``sk-bob-0123456789``.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from serving.proxy import KeyRing, ProxyApp, ProxyConfig, digest_of
from serving.proxy.runner import uvicorn_settings
from tests.harness.stub_engine import StubEngine, UvicornThread

ALICE = "sk-alice-0123456789"
BOB = "sk-bob-0123456789"
KEYS = {"alice": digest_of(ALICE), "bob": digest_of(BOB)}
AUTH = {"Authorization": f"Bearer {ALICE}"}
CHAT = {"model": "stub-model", "messages": [{"role": "user", "content": "say three words"}]}


def serve_proxy(app: Any, settings: ProxyConfig, **overrides: Any) -> UvicornThread:
    """``app`` served as the proxy serves (serving/proxy/runner.py's uvicorn settings: httptools
    with the head limits, keep-alive, no access log) in a thread on a free loopback port;
    ``overrides``: uvicorn settings changed for a test (shutdown waits 1 s by default)."""
    kw = {**uvicorn_settings(settings), "log_level": "critical", "timeout_graceful_shutdown": 1}
    return UvicornThread(app, **{**kw, **overrides}).start()


@dataclass
class RunningProxy:
    app: ProxyApp
    server: UvicornThread

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def port(self) -> int:
        return self.server.port

    def client(self, **kw: Any) -> httpx.Client:
        kw.setdefault("timeout", 10)
        return httpx.Client(base_url=self.url, **kw)


@dataclass
class RawResponse:
    status: int
    headers: dict[str, str]
    body: bytes


def wait_until(
    predicate: Callable[[], bool], timeout: float = 5.0, what: str = "condition"
) -> None:
    """Poll ``predicate`` (a synchronisation helper, not a timing assertion)."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what} after {timeout} s")
        time.sleep(0.01)


def send_until_close(port: int, request: bytes, timeout: float = 5.0) -> bytes:
    """Send ``request`` verbatim; return every byte received until the server closes."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(request)
        data = b""
        while True:
            try:
                piece = sock.recv(65536)
            except (ConnectionResetError, TimeoutError):
                break
            if not piece:
                break
            data += piece
    return data


def raw_http(port: int, request: bytes, timeout: float = 5.0) -> RawResponse:
    """Send ``request`` verbatim, read until the server closes, parse one response."""
    data = send_until_close(port, request, timeout)
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1]) if lines and lines[0] else 0
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return RawResponse(status, headers, body)


def raw_request(
    method: str, path: str, *, body: bytes = b"", headers: dict[str, str] | None = None
) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", "Connection: close"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    if body or method == "POST":
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class ScriptedEngine:
    """A raw TCP "engine" on loopback. ``/health`` gets ``200 ok`` (keep-alive); any other
    request is recorded (request line) and then handled by ``answer``: ``"close"`` drops the
    connection without a response byte, ``"silent"`` never answers, bytes are sent as the
    response as they are (then the connection waits for the next request). ``answer_health=False``
    leaves ``/health`` unanswered too. Counts accepted and currently open connections."""

    def __init__(self, answer: str | bytes = "close", answer_health: bool = True) -> None:
        self.answer = answer
        self.answer_health = answer_health
        self.requests: list[str] = []
        self.accepted = 0
        self.open = 0
        self._lock = threading.Lock()
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._stopped = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stopped:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self.accepted += 1
                self.open += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        buf = b""
        try:
            while True:
                while b"\r\n\r\n" not in buf:
                    piece = conn.recv(65536)
                    if not piece:
                        return  # the proxy closed the connection
                    buf += piece
                head, _, buf = buf.partition(b"\r\n\r\n")
                line = head.split(b"\r\n", 1)[0].decode("latin-1")
                length = 0
                for header in head.split(b"\r\n")[1:]:
                    name, _, value = header.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value)
                while len(buf) < length:
                    piece = conn.recv(65536)
                    if not piece:
                        return
                    buf += piece
                buf = buf[length:]
                if line.startswith("GET /health ") and self.answer_health:
                    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                    continue
                with self._lock:
                    self.requests.append(line)
                if isinstance(self.answer, bytes):
                    conn.sendall(self.answer)
                    continue
                if self.answer == "close" and not line.startswith("GET /health "):
                    return
                while conn.recv(65536):  # "silent": wait for the proxy to hang up
                    pass
                return
        except OSError:
            return
        finally:
            conn.close()
            with self._lock:
                self.open -= 1

    def stop(self) -> None:
        self._stopped = True
        self._listener.close()


@pytest.fixture
def scripted_engine() -> Iterator[Callable[..., ScriptedEngine]]:
    made: list[ScriptedEngine] = []

    def make(**kw: Any) -> ScriptedEngine:
        made.append(ScriptedEngine(**kw))
        return made[-1]

    yield make
    for engine in made:
        engine.stop()


@pytest.fixture
def stub_engine() -> Iterator[StubEngine]:
    engine = StubEngine(tokens=4).start()
    try:
        yield engine
    finally:
        engine.stop()


@pytest.fixture
def start_proxy(stub_engine: StubEngine) -> Iterator[Callable[..., RunningProxy]]:
    started: list[RunningProxy] = []
    with _proxy_factory(stub_engine, started) as start:
        yield start


@pytest.fixture(scope="module")
def shared_pair() -> Iterator[tuple[RunningProxy, StubEngine]]:
    """One stub + proxy for a whole module of tests that only read (records reset per use)."""
    engine = StubEngine(tokens=4).start()
    started: list[RunningProxy] = []
    try:
        with _proxy_factory(engine, started) as start:
            yield start(), engine
    finally:
        engine.stop()


@contextlib.contextmanager
def _proxy_factory(
    stub_engine: StubEngine, started: list[RunningProxy]
) -> Iterator[Callable[..., RunningProxy]]:

    def start(wait_ready: bool = True, upstream: str | None = None, **config: Any) -> RunningProxy:
        config.setdefault("health_interval_s", 0.05)
        settings = ProxyConfig(upstream=upstream or stub_engine.url, **config)
        app = ProxyApp(settings, KeyRing(KEYS))
        running = RunningProxy(app, serve_proxy(app, settings))
        started.append(running)
        if wait_ready:
            wait_until(lambda: app.ready, what="the proxy to see the engine ready")
        return running

    try:
        yield start
    finally:
        for running in started:  # stop them together: each stop takes ~0.1 s of polling
            running.server.request_stop()
        stub_engine.request_stop()
        for running in started:
            running.server.join()


@pytest.fixture
def proxy(start_proxy: Callable[..., RunningProxy]) -> RunningProxy:
    return start_proxy()
