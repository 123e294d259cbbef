"""HTTP-level tricks against the proxy, as deployed (uvicorn with the proxy's httptools protocol
and head limits) and on uvicorn's plain HTTP stacks (httptools, and the h11 fallback):
request-target forms, pipelining, HTTP/1.0, request smuggling with Transfer-Encoding +
Content-Length, and header injection. Whatever the stack makes of the bytes, the engine only
ever sees allowlisted paths and headers, once each."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from serving.proxy import KeyRing, ProxyApp, ProxyConfig
from tests.harness.stub_engine import StubEngine, UvicornThread
from tests.serving.conftest import ALICE, CHAT, KEYS, send_until_close, serve_proxy, wait_until

AUTH_LINE = f"Authorization: Bearer {ALICE}\r\n".encode()
BODY = json.dumps(CHAT).encode()
ENGINE_PATHS = {"/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/models"}
ENGINE_HEADERS = {
    "host", "accept", "user-agent", "traceparent", "tracestate", "content-type",
    "content-length", "x-request-id",
}  # fmt: skip


@pytest.fixture(scope="module", params=["httptools", "h11", "uvicorn-limits"])
def pair(request: pytest.FixtureRequest) -> Iterator[tuple[int, StubEngine]]:
    # "uvicorn-limits": as deployed, httptools with the head limits (server.py) and the
    # proxy's uvicorn settings (runner.py); the others: uvicorn's own protocols as they are
    engine = StubEngine(tokens=2).start()
    config = ProxyConfig(upstream=engine.url, health_interval_s=0.05)
    app = ProxyApp(config, KeyRing(KEYS))
    if request.param == "uvicorn-limits":
        server = serve_proxy(app, config)
    else:
        server = UvicornThread(app, http=request.param).start()
    try:
        wait_until(lambda: app.ready, what="readiness")
        yield server.port, engine
    finally:
        server.stop()
        engine.stop()


def exchange(port: int, data: bytes) -> tuple[list[int], bytes]:
    """Send bytes verbatim; read until the proxy closes; return every status line's code."""
    received = send_until_close(port, data)
    return [int(code) for code in re.findall(rb"HTTP/1\.[01] (\d{3}) ", received)], received


def check_engine_saw_only_allowed(engine: StubEngine) -> list[dict[str, Any]]:
    hits = engine.requests()
    for hit in hits:
        assert hit["raw_path"] in ENGINE_PATHS and hit["query"] == "", hit
        assert set(hit["headers"]) <= ENGINE_HEADERS, hit["headers"]
    return hits


TARGETS = [
    "http://x//v1/models", "http://x/v1/../metrics", "http://x/tokenize", "http://x/v1/%6dodels",
    "/v1/%6dodels", "/v1/models%2f", "/./v1/models", "/%2Fv1/models", "/v1/models%20", "*",
    "v1/models", "//127.0.0.1:1/v1/models", "/v1/models/.", "/v1/models/%2e",
]  # fmt: skip


@pytest.mark.parametrize("target", TARGETS)
def test_request_target_tricks_never_reach_the_engine(
    pair: tuple[int, StubEngine], target: str
) -> None:
    port, engine = pair
    engine.reset()
    request = f"GET {target} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n".encode() + AUTH_LINE
    statuses, _ = exchange(port, request + b"\r\n")
    assert statuses in ([404], [400]), (target, statuses)
    assert engine.requests() == []


def test_absolute_form_reaches_at_most_the_exact_path(pair: tuple[int, StubEngine]) -> None:
    # httptools hands the app the path of an absolute-form target (RFC 9112 says servers must
    # accept it), h11 the whole URL (404): either way only "/v1/models" can reach the engine.
    port, engine = pair
    engine.reset()
    request = b"GET http://evil.example/v1/models?x=1 HTTP/1.1\r\nHost: y\r\nConnection: close\r\n"
    statuses, _ = exchange(port, request + AUTH_LINE + b"\r\n")
    assert statuses in ([200], [404])
    hits = check_engine_saw_only_allowed(engine)
    assert len(hits) == (statuses == [200])
    assert all(hit["headers"]["host"] != "evil.example" for hit in hits)


def test_pipelined_requests_are_answered_in_order_and_only_allowed_ones_forwarded(
    pair: tuple[int, StubEngine],
) -> None:
    port, engine = pair
    engine.reset()
    post = b"POST %s HTTP/1.1\r\nHost: x\r\n" + AUTH_LINE + b"Content-Length: %d\r\n\r\n%s"
    pipeline = (
        b"GET /tokenize HTTP/1.1\r\nHost: x\r\n%s\r\n" % AUTH_LINE  # no body: stays open
        + post % (b"/v1/chat/completions", len(BODY), BODY)
        + b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n%s\r\n" % AUTH_LINE
    )
    statuses, _ = exchange(port, pipeline)
    assert statuses == [404, 200, 200]
    hits = check_engine_saw_only_allowed(engine)
    assert [(h["method"], h["raw_path"]) for h in hits] == [
        ("POST", "/v1/chat/completions"), ("GET", "/v1/models"),
    ]  # fmt: skip
    assert hits[0]["body"] == BODY.decode()


def test_http_1_0_clients_are_served(pair: tuple[int, StubEngine]) -> None:
    port, engine = pair
    engine.reset()
    statuses, raw = exchange(port, b"GET /v1/models HTTP/1.0\r\n" + AUTH_LINE + b"\r\n")
    assert statuses == [200] and b'"stub-model"' in raw
    head = b"POST /v1/chat/completions HTTP/1.0\r\nContent-Length: %d\r\n" % len(BODY)
    statuses, raw = exchange(port, head + AUTH_LINE + b"\r\n" + BODY)
    assert statuses == [200] and b'"usage"' in raw
    assert len(check_engine_saw_only_allowed(engine)) == 2


SMUGGLED = b"POST /tokenize HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 2\r\n\r\n{}"
CHUNKED_BODY = b"%x\r\n%s\r\n0\r\n\r\n" % (len(BODY), BODY)


@pytest.mark.parametrize(
    "framing",
    [
        b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n",
        b"Transfer-Encoding: chunked\r\nContent-Length: 4\r\n",
        b"Content-Length: %d\r\nTransfer-Encoding: chunked\r\n" % (len(CHUNKED_BODY) + 60),
        b"Transfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n",
        b"Transfer-Encoding: xchunked\r\nContent-Length: %d\r\n" % len(CHUNKED_BODY),
    ],
    ids=["cl-te", "te-cl", "cl-long", "te-te", "te-obfuscated"],
)
def test_conflicting_framing_never_smuggles_a_request_to_the_engine(
    pair: tuple[int, StubEngine], framing: bytes
) -> None:
    port, engine = pair
    engine.reset()
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + AUTH_LINE + framing + b"\r\n"
    statuses, _ = exchange(port, head + CHUNKED_BODY + SMUGGLED)
    assert statuses, "no answer at all"
    hits = check_engine_saw_only_allowed(engine)  # never /tokenize
    assert len(hits) <= 1
    for hit in hits:  # when a stack accepts it, the engine gets one clean, re-framed request
        assert hit["body"] == BODY.decode()
        assert hit["headers"]["content-length"] == str(len(BODY))
        assert "transfer-encoding" not in hit["headers"]


@pytest.mark.parametrize(
    "header",
    [
        b"User-Agent: a\r\n X-Injected: 1\r\n",  # obsolete line folding
        b"User-Agent: a\nX-Injected: 1\r\n",  # bare LF
        b"User-Agent: a\rX-Injected: 1\r\n",  # bare CR
        b"User-Agent: a\x00X-Injected: 1\r\n",  # NUL
        b"traceparent: 00-ab-cd-01\r\n\tX-Injected: 1\r\n",
    ],
    ids=["obs-fold", "bare-lf", "bare-cr", "nul", "fold-tab"],
)
def test_header_injection_never_adds_a_header_at_the_engine(
    pair: tuple[int, StubEngine], header: bytes
) -> None:
    port, engine = pair
    engine.reset()
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + AUTH_LINE
    request = head + header + b"Content-Length: %d\r\n\r\n" % len(BODY) + BODY
    statuses, _ = exchange(port, request)
    assert statuses in ([200], [400])
    for hit in check_engine_saw_only_allowed(engine):
        assert "x-injected" not in hit["headers"]
        for value in hit["headers"].values():
            assert not set(value) & {"\r", "\n", "\x00"}
