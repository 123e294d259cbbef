"""Bad input: oversized bodies (413) and invalid JSON (400) never reach the engine, never 500."""

from __future__ import annotations

import json
import socket
from collections.abc import Callable
from typing import Any

import pytest

from tests.harness.stub_engine import StubEngine
from tests.serving.conftest import AUTH, CHAT, RunningProxy, raw_http, raw_request

LIMIT = 2048


@pytest.fixture
def small_proxy(start_proxy: Callable[..., RunningProxy]) -> RunningProxy:
    return start_proxy(max_body_bytes=LIMIT)


def test_body_over_the_limit_by_content_length_is_413(
    small_proxy: RunningProxy, stub_engine: StubEngine
) -> None:
    big = {"model": "m", "prompt": "x" * LIMIT}
    with small_proxy.client(headers=AUTH) as c:
        r = c.post("/v1/completions", json=big)
        assert r.status_code == 413
        assert r.json()["error"]["code"] == "request_too_large"
        ok = {"model": "m", "prompt": "x" * (LIMIT - 100)}
        assert c.post("/v1/completions", json=ok).status_code == 200
    assert len(stub_engine.requests()) == 1


def test_chunked_body_over_the_limit_is_413(
    small_proxy: RunningProxy, stub_engine: StubEngine
) -> None:
    # No Content-Length: the proxy must count the streamed chunks itself.
    piece = b"x" * 1000
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for _ in range(5)) + b"0\r\n\r\n"
    head = (
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        f"Authorization: {AUTH['Authorization']}\r\nTransfer-Encoding: chunked\r\n\r\n"
    ).encode()
    response = raw_http(small_proxy.port, head + chunks)
    assert response.status == 413
    assert stub_engine.requests() == []


def test_small_chunked_body_is_forwarded_whole(
    small_proxy: RunningProxy, stub_engine: StubEngine
) -> None:
    body = json.dumps(CHAT).encode()
    half = len(body) // 2
    chunks = (
        b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in (body[:half], body[half:])) + b"0\r\n\r\n"
    )
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        f"Authorization: {AUTH['Authorization']}\r\nTransfer-Encoding: chunked\r\n\r\n"
    ).encode()
    assert raw_http(small_proxy.port, head + chunks).status == 200
    [hit] = stub_engine.requests()
    assert hit["body"].encode() == body
    assert hit["headers"]["content-length"] == str(len(body))


BAD_BODIES = [
    b"", b"{", b"{'model': 'm'}", b"[]", b"null", b"42", b'"text"', b"NaN", b'{"t": NaN}',
    b'{"t": Infinity}', b"\xff\xfe{}", b'{"a": 1} trailing', b"[" * 50000 + b"]" * 50000,
    b'{"model": "m", "stream": "yes"}', b'{"model": "m", "stream": 1}',
]  # fmt: skip


@pytest.mark.parametrize("body", BAD_BODIES, ids=[f"bad{i}" for i in range(len(BAD_BODIES))])
def test_invalid_json_is_400_with_an_openai_error_body(
    shared_pair: tuple[RunningProxy, StubEngine], body: bytes
) -> None:
    proxy, engine = shared_pair
    engine.reset()
    request = raw_request(
        "POST", "/v1/chat/completions", body=body,
        headers={**AUTH, "Content-Type": "application/json"},
    )  # fmt: skip
    response = raw_http(proxy.port, request)
    assert response.status == 400, response
    error = json.loads(response.body)["error"]
    assert error["type"] == "invalid_request_error"
    assert error["code"] == "invalid_json"
    assert isinstance(error["message"], str) and error["message"]
    assert engine.requests() == []


def test_malformed_content_length_is_rejected_before_the_engine(
    shared_pair: tuple[RunningProxy, StubEngine],
) -> None:
    proxy, engine = shared_pair
    engine.reset()
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        + f"Authorization: {AUTH['Authorization']}\r\n".encode()
        + b"Content-Length: -5\r\n\r\n{}"
    )
    response = raw_http(proxy.port, request)
    assert 400 <= response.status < 500
    assert engine.requests() == []


@pytest.mark.parametrize(
    ("path", "auth", "status"),
    [
        ("/tokenize", AUTH, 404),
        ("/v1/chat/completions", {}, 401),
        ("/v1/chat/completions", {"Authorization": "Bearer wrong-key"}, 403),
        ("/v1/models", AUTH, 405),
        ("/v1/chat/completions", AUTH, 413),
    ],
)
def test_answer_without_reading_the_body_closes_the_connection(
    small_proxy: RunningProxy, path: str, auth: dict[str, str], status: int
) -> None:
    # The client announces 10 MB but sends only the head. Keeping the connection alive would
    # mean reading (and discarding) whatever it sends next; the proxy answers and closes.
    lines = [f"POST {path} HTTP/1.1", "Host: x", "Content-Length: 10000000"]
    lines += [f"{k}: {v}" for k, v in auth.items()]
    with socket.create_connection(("127.0.0.1", small_proxy.port), timeout=5) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + b'{"model": ')
        received = b""
        while piece := sock.recv(65536):  # ends only when the proxy closes the connection
            received += piece
    assert received.startswith(b"HTTP/1.1 %d " % status)
    assert b"\r\nconnection: close\r\n" in received.lower()


# The body check is orjson now (issue 13): what the stdlib parser refused, it refuses too, and
# it also refuses a lone surrogate escape; an over-long integer is still valid JSON.
@pytest.mark.parametrize(
    ("body", "status"),
    [
        (b'{"t": 1e400}', 400),  # overflows to infinity: not a JSON number we accept
        (b'{"t": -Infinity}', 400),
        (b'{"t": "\\ud800"}', 400),  # lone surrogate escape
        (b'{"t": "\xed\xa0\x80"}', 400),  # a surrogate encoded as UTF-8: invalid UTF-8
        (b'{"t": "a\x01b"}', 400),  # raw control character inside a string
        (b'{"model": "m", "seed": 123456789012345678901234567890}', 200),
    ],
    ids=["1e400", "-inf", "lone-surrogate", "utf8-surrogate", "control-char", "long-int"],
)
def test_the_fast_json_check_keeps_the_400_guarantee(
    shared_pair: tuple[RunningProxy, StubEngine], body: bytes, status: int
) -> None:
    response, engine = _post_json(shared_pair, body)
    assert response.status == status, response
    assert len(engine.requests()) == (status == 200)


def _post_json(pair: tuple[RunningProxy, StubEngine], body: bytes) -> tuple[Any, StubEngine]:
    """POST `body` as a chat completion over a raw socket: (the answer, the reset engine)."""
    proxy, engine = pair
    engine.reset()
    request = raw_request(
        "POST", "/v1/chat/completions", body=body,
        headers={**AUTH, "Content-Type": "application/json"},
    )  # fmt: skip
    return raw_http(proxy.port, request), engine


# Bodies of 16 KiB and more are checked by simdjson first (issue 13: a long chat history of
# small messages at >= 1 GB/s); orjson has the last word whenever simdjson refuses. The same
# cases as above, padded past that size with a long string field, must give the same answers.
_PAD = b'"pad": "' + b"x" * 20000 + b'", '
LARGE_CASES = [
    (b'{' + _PAD + b'"t": 1e400}', 400),
    (b'{' + _PAD + b'"t": -Infinity}', 400),
    (b'{' + _PAD + b'"t": NaN}', 400),
    (b'{' + _PAD + b'"t": "\\ud800"}', 400),
    (b'{' + _PAD + b'"t": "\xed\xa0\x80"}', 400),
    (b'{' + _PAD + b'"t": "\xff"}', 400),
    (b'{' + _PAD + b'"t": "a\x01b"}', 400),
    (b'{' + _PAD + b'"t": 1} trailing', 400),
    (b'{' + _PAD + b'"t": 1,}', 400),
    (b'[' + _PAD[:-2] + b']', 400),  # an array, not an object
    (b'"' + b"x" * 20000 + b'"', 400),  # a string
    (b'{' + _PAD + b'"stream": "yes"}', 400),
    (b'{' + _PAD + b'"stream": {"a": 1}}', 400),
    (b'{' + _PAD + b'"model": "m", "seed": 123456789012345678901234567890}', 200),
    (b'{' + _PAD + b'"t": ' + b'{"a": ' * 500 + b"1" + b"}" * 500 + b"}", 200),  # deep
    (b'{' + _PAD + b'"t": ' + b"[" * 2000 + b"]" * 2000 + b"}", 400),  # too deep
    (b'{' + _PAD + b'"t": "\\ud83d\\ude00", "model": "m"}', 200),  # a surrogate pair
]  # fmt: skip


@pytest.mark.parametrize(
    ("body", "status"), LARGE_CASES, ids=[f"large{i}" for i in range(len(LARGE_CASES))]
)
def test_large_bodies_keep_the_400_guarantee(
    shared_pair: tuple[RunningProxy, StubEngine], body: bytes, status: int
) -> None:
    assert len(body) >= 16 * 1024
    response, engine = _post_json(shared_pair, body)
    assert response.status == status, response
    if status == 400:
        assert json.loads(response.body)["error"]["code"] == "invalid_json"
    assert len(engine.requests()) == (status == 200)


def test_large_stream_request_is_streamed_with_usage_as_asked(
    shared_pair: tuple[RunningProxy, StubEngine],
) -> None:
    # stream / stream_options.include_usage read from a large body (the simdjson path)
    proxy, _ = shared_pair
    history = [{"role": "user", "content": f"message {i} " + "word " * 20} for i in range(400)]
    for asks in (False, True):
        body = {"model": "m", "messages": history, "stream": True}
        if asks:
            body["stream_options"] = {"include_usage": True}
        raw = json.dumps(body).encode()
        assert len(raw) >= 16 * 1024
        with proxy.client(headers=AUTH) as c:
            r = c.post("/v1/chat/completions", content=raw)
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        assert r.text.endswith("data: [DONE]\n\n")
        assert ('"choices":[]' in r.text.replace(" ", "")) is asks, r.text[-400:]


def test_the_body_check_agrees_with_orjson_on_many_shapes() -> None:
    # The check in-process on bodies on both sides of the simdjson threshold: it accepts
    # exactly what orjson accepts (as an object) and reads stream / include_usage the same.
    import orjson

    from serving.proxy.app import _SIMDJSON_FROM, check_body

    pad = "x" * _SIMDJSON_FROM
    deep = b"{" + _PAD + b'"t": ' + b'{"a": ' * 1022 + b"1" + b"}" * 1022 + b"}"  # 1024 levels
    shapes: list[bytes] = (
        [deep]
        + [case for case, _ in LARGE_CASES]
        + [
            json.dumps({"pad": pad, "stream": s, "stream_options": o}).encode()
            for s in (True, False, None, 0, "true")
            for o in (None, {"include_usage": True}, {"include_usage": 1}, [True], "x")
        ]
        # Keys given twice: orjson (and the engines' Python parsers) take the last value,
        # simdjson the first; the check must read what the engine will read.
        + [
            b'{"pad": "' + pad.encode() + b'", ' + dup + b"}"
            for dup in (
                b'"stream": 1, "stream": true',
                b'"stream": false, "stream": true',
                b'"stream": true, "stream": "yes"',
                b'"stream": true, "stream_options": {}, "stream_options": {"include_usage": true}',
                b'"stream": true, "stream_options": {"include_usage": false,'
                b' "include_usage": true}',
            )
        ]
        # A wide object (more top-level keys than the simdjson path lists).
        + [json.dumps({"pad": pad, **{f"k{i}": i for i in range(100)}, "stream": True}).encode()]
    )
    for body in shapes + [b[len(_PAD) + 1 :] if b.startswith(b"{" + _PAD) else b for b in shapes]:
        try:
            data = orjson.loads(body)
        except orjson.JSONDecodeError:
            data = None
        problem, stream, usage = check_body(body)
        if not isinstance(data, dict) or not isinstance(data.get("stream", False), bool):
            assert problem is not None, body[:80]
            continue
        assert problem is None, (problem, body[:80])
        options = data.get("stream_options")
        assert stream is data.get("stream", False)
        assert usage is (isinstance(options, dict) and options.get("include_usage") is True)
