"""SSE relay: piece by piece, keep-alive comments, mid-stream failures, client disconnects."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from tests.harness.stub_engine import StubEngine
from tests.serving.conftest import AUTH, CHAT, RunningProxy, wait_until

STREAM = {**CHAT, "stream": True}
WITH_USAGE = {**STREAM, "stream_options": {"include_usage": True}}


def events(raw: bytes) -> list[bytes]:
    return [e for e in raw.split(b"\n\n") if e]


def test_stream_is_relayed_while_the_engine_is_still_generating(
    proxy: RunningProxy, stub_engine: StubEngine
) -> None:
    # The engine sends 2 tokens then goes quiet for 30 s: a buffering proxy would show nothing.
    held = {**STREAM, "stub": {"fail": "pause", "fail_after_tokens": 2, "pause_s": 30}}
    with proxy.client(headers=AUTH) as c, c.stream("POST", "/v1/chat/completions", json=held) as r:
        assert r.status_code == 200
        assert r.headers["x-accel-buffering"] == "no"
        assert r.headers["content-type"].startswith("text/event-stream")
        got = b""
        reader = r.iter_raw()
        while got.count(b"\n\n") < 2:
            got += next(reader)
        [record] = stub_engine.requests()
        assert record["tokens_sent"] == 2 and not record["completed"]
        assert [json.loads(e[6:])["choices"][0]["delta"]["content"] for e in events(got)] == [
            "tok0 ", "tok1 ",
        ]  # fmt: skip


def test_full_stream_arrives_intact(proxy: RunningProxy) -> None:
    with proxy.client(headers=AUTH) as c:
        raw = c.post(
            "/v1/completions", json={"model": "m", "prompt": "a b", "stream": True}
        ).content
    parts = events(raw)
    assert [json.loads(p[6:])["choices"][0]["text"] for p in parts[:-1]] == [
        "tok0 ", "tok1 ", "tok2 ", "tok3 ",
    ]  # fmt: skip
    assert parts[-1] == b"data: [DONE]"


def test_keepalive_comments_fill_long_silences(
    start_proxy: Callable[..., RunningProxy], stub_engine: StubEngine
) -> None:
    proxy = start_proxy(keepalive_s=0.1)
    quiet = {**STREAM, "stub": {"fail": "pause", "fail_after_tokens": 1, "pause_s": 0.6}}
    with proxy.client(headers=AUTH) as c:
        raw = c.post("/v1/chat/completions", json=quiet).content
    parts = events(raw)
    assert b": keep-alive" in parts
    first_keepalive = parts.index(b": keep-alive")
    # keep-alives only in the silence: after token 0, before token 1; the stream still ends well
    assert b"tok0" in parts[first_keepalive - 1] and parts[-1] == b"data: [DONE]"
    assert sum(1 for p in parts if p.startswith(b"data: {")) == 4


def test_keepalive_never_splits_an_event_the_engine_is_half_way_through(
    start_proxy: Callable[..., RunningProxy],
) -> None:
    # A client that asked for usage gets the engine's bytes as they come, half event included,
    # so no keep-alive may be sent in the pause.
    proxy = start_proxy(keepalive_s=0.1)
    split = {**WITH_USAGE, "stub": {"fail": "pause_mid_event", "fail_after_tokens": 1,
                                    "pause_s": 0.5}}  # fmt: skip
    with proxy.client(headers=AUTH) as c:
        raw = c.post("/v1/chat/completions", json=split).content
    parts = events(raw)
    assert b"keep-alive" not in raw
    chunks = [json.loads(p[6:]) for p in parts[:-1]]
    assert [c["choices"][0]["delta"]["content"] for c in chunks if c["choices"]] == [
        "tok0 ", "tok1 ", "tok2 ", "tok3 ",
    ]  # fmt: skip


def test_half_events_are_held_back_while_usage_chunks_are_filtered(
    start_proxy: Callable[..., RunningProxy],
) -> None:
    # Other clients go through the usage-chunk filter, which relays whole events only: the
    # half event waits at the proxy (an SSE client could not use it before its blank line
    # anyway), so a keep-alive in the pause falls between whole events.
    proxy = start_proxy(keepalive_s=0.1)
    split = {**STREAM, "stub": {"fail": "pause_mid_event", "fail_after_tokens": 1, "pause_s": 0.5}}
    with proxy.client(headers=AUTH) as c:
        raw = c.post("/v1/chat/completions", json=split).content
    parts = events(raw)
    assert b": keep-alive" in parts
    data = [json.loads(p[6:]) for p in parts if p.startswith(b"data: {")]
    assert [c["choices"][0]["delta"]["content"] for c in data] == [
        "tok0 ", "tok1 ", "tok2 ", "tok3 ",
    ]  # fmt: skip
    assert parts[parts.index(b": keep-alive") - 1].startswith(b"data: {")
    assert parts[-1] == b"data: [DONE]"


def test_engine_silent_past_the_upstream_timeout_ends_the_stream_with_an_error(
    start_proxy: Callable[..., RunningProxy], stub_engine: StubEngine
) -> None:
    proxy = start_proxy(keepalive_s=0.1, upstream_timeout_s=0.35)
    stuck = {**STREAM, "stub": {"fail": "pause", "fail_after_tokens": 1, "pause_s": 30}}
    with proxy.client(headers=AUTH) as c:
        raw = c.post("/v1/chat/completions", json=stuck).content
    parts = events(raw)
    assert b"tok0" in parts[0] and parts[1] == b": keep-alive"
    assert json.loads(parts[-2][6:])["error"]["code"] == "engine_stream_failed"
    assert parts[-1] == b"data: [DONE]"
    wait_until(lambda: stub_engine.requests()[0]["cancelled"], what="the engine to see the abort")


@pytest.mark.parametrize("asks_usage", [True, False], ids=["passthrough", "filtered"])
def test_engine_stuck_half_way_through_an_event_gets_that_event_closed_before_the_error(
    start_proxy: Callable[..., RunningProxy], stub_engine: StubEngine, asks_usage: bool
) -> None:
    proxy = start_proxy(keepalive_s=0.1, upstream_timeout_s=0.35)
    stub = {"fail": "pause_mid_event", "fail_after_tokens": 1, "pause_s": 30}
    stuck = {**(WITH_USAGE if asks_usage else STREAM), "stub": stub}
    with proxy.client(headers=AUTH) as c:
        raw = c.post("/v1/chat/completions", json=stuck).content
    parts = events(raw)
    assert b"tok0" in parts[0]
    if asks_usage:  # the engine's bytes as they came: its half event, then the error
        assert parts[1].startswith(b"data: {") and b"tok1" not in parts[1]  # the engine's half
        # the half event is terminated first, so the error is an event of its own
        assert b"keep-alive" not in raw  # never inside the half-sent event
        parts = [parts[0], *parts[2:]]
    else:  # the half event was held back and is dropped: the client sees whole events only
        assert all(p == b": keep-alive" for p in parts[1:-2])
        parts = [p for p in parts if p != b": keep-alive"]
    assert json.loads(parts[1].removeprefix(b"data: "))["error"]["code"] == "engine_stream_failed"
    assert parts[2:] == [b"data: [DONE]"]
    wait_until(lambda: stub_engine.requests()[0]["cancelled"], what="the engine to see the abort")


def test_no_keepalive_when_the_engine_is_not_silent(
    start_proxy: Callable[..., RunningProxy],
) -> None:
    proxy = start_proxy(keepalive_s=5)
    quiet = {**STREAM, "stub": {"fail": "pause", "fail_after_tokens": 1, "pause_s": 0.3}}
    with proxy.client(headers=AUTH) as c:
        raw = c.post("/v1/chat/completions", json=quiet).content
    assert b"keep-alive" not in raw


def test_engine_dying_mid_stream_becomes_an_error_event_and_done(
    proxy: RunningProxy, stub_engine: StubEngine
) -> None:
    dying = {**STREAM, "stub": {"fail": "die_mid_stream", "fail_after_tokens": 2}}
    with proxy.client(headers=AUTH) as c:
        r = c.post("/v1/chat/completions", json=dying)
    assert r.status_code == 200  # already sent when the engine died
    parts = events(r.content)
    assert len(parts) == 4
    assert all(b"tok" in p for p in parts[:2])
    error = json.loads(parts[2].removeprefix(b"data: "))["error"]
    assert error["code"] == "engine_stream_failed" and error["type"] == "upstream_error"
    assert parts[3] == b"data: [DONE]"
    assert proxy.app.metrics.upstream_errors["mid_stream"] == 1
    assert len(stub_engine.requests()) == 1  # not retried


def test_client_disconnect_mid_stream_aborts_the_engine_request(
    proxy: RunningProxy, stub_engine: StubEngine
) -> None:
    slow = {**STREAM, "stub": {"tokens": 500, "token_delay_ms": 20}}
    with proxy.client(headers=AUTH) as c, c.stream("POST", "/v1/chat/completions", json=slow) as r:
        assert next(r.iter_raw()).startswith(b"data: ")
    # the client hung up: the engine must see its request cancelled long before token 500
    wait_until(lambda: stub_engine.requests()[0]["cancelled"], what="the engine to see a cancel")
    record = stub_engine.requests()[0]
    assert not record["completed"] and record["tokens_sent"] < 500
    wait_until(lambda: proxy.app.metrics.in_flight == 0, what="in-flight to drain")
    assert proxy.app.metrics.requests[("chat_completions", "499", "alice")] == 1


def test_client_disconnect_while_waiting_for_a_non_stream_answer_aborts_it(
    proxy: RunningProxy, stub_engine: StubEngine
) -> None:
    import httpx

    slow = {**CHAT, "stub": {"first_token_delay_ms": 20000}}
    with proxy.client(headers=AUTH, timeout=httpx.Timeout(10, read=0.3)) as c:
        try:
            c.post("/v1/chat/completions", json=slow)
        except httpx.ReadTimeout:
            pass  # the client gives up and closes its connection
        else:
            raise AssertionError("the stub answered a 20 s request at once")
    wait_until(lambda: stub_engine.requests()[0]["cancelled"], what="the engine to see a cancel")
    wait_until(lambda: proxy.app.metrics.in_flight == 0, what="in-flight to drain")


def test_stream_usage_is_counted_when_the_engine_reports_it(
    proxy: RunningProxy, stub_engine: StubEngine
) -> None:
    with_usage = {**STREAM, "stream_options": {"include_usage": True}, "stub": {"tokens": 7}}
    with proxy.client(headers=AUTH) as c:
        raw = c.post("/v1/chat/completions", json=with_usage).content
        assert b'"usage"' in raw
        c.post("/v1/chat/completions", json=STREAM)  # no usage asked: nothing to count
        c.post("/v1/chat/completions", json={**CHAT, "stub": {"tokens": 5}})  # non-stream
        c.post("/v1/embeddings", json={"model": "m", "input": "one two three"})
    tokens = proxy.app.metrics.tokens
    assert tokens[("alice", "completion")] == 7 + 5
    assert tokens[("alice", "prompt")] == 3 + 3 + 3  # "say three words" twice, 3 input words
    # the body went through untouched: the proxy does not inject stream_options
    bodies = [json.loads(r["body"]) for r in stub_engine.requests()]
    assert "stream_options" not in bodies[1]
