"""Engine misbehaviour and failures inside the proxy: no engine connection is left open, no
request is sent twice, and the engine stops generating when nobody will read the answer."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from serving.proxy import KeyRing, ProxyApp, ProxyConfig
from serving.proxy import relay as relay_module
from serving.proxy.relay import Relay
from tests.harness.stub_engine import Message, Receive, Scope, Send, StubEngine, UvicornThread
from tests.serving.conftest import AUTH, CHAT, KEYS, RunningProxy, ScriptedEngine, wait_until

STREAM = {**CHAT, "stream": True}


def test_engine_closing_before_any_response_byte_is_502_and_never_resent(
    start_proxy: Callable[..., RunningProxy], scripted_engine: Callable[..., ScriptedEngine]
) -> None:
    # The connection was made and the request written: the engine may have started it, so
    # the proxy must not try again even though not a single response byte came back.
    engine = scripted_engine(answer="close")
    proxy = start_proxy(upstream=engine.url, connect_retries=3)
    with proxy.client(headers=AUTH) as c:
        r = c.post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 502
    assert r.json()["error"]["code"] == "engine_failed"
    assert engine.requests == ["POST /v1/chat/completions HTTP/1.1"]
    assert proxy.app.metrics.connect_retries == 0


def test_unanswered_health_polls_do_not_pile_up_open_connections(
    start_proxy: Callable[..., RunningProxy], scripted_engine: Callable[..., ScriptedEngine]
) -> None:
    engine = scripted_engine(answer="silent", answer_health=False)
    proxy = start_proxy(
        upstream=engine.url, wait_ready=False, health_interval_s=0.02, health_timeout_s=0.05
    )
    wait_until(lambda: engine.accepted >= 5, what="several /health polls")
    assert not proxy.app.ready
    assert "did not answer within 0.05 s" in proxy.app._ready_reason
    # each timed-out poll closes its connection: at most the current poll's is open
    wait_until(lambda: engine.open <= 1, what="timed-out polls to close their connections")


class _FailingSend:
    """Wraps the proxy: the second response-body message raises (a bug of ours, or uvicorn
    refusing a message), so the relay dies while the engine is still generating."""

    def __init__(self, app: ProxyApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        bodies = 0

        async def failing_send(message: Message) -> None:
            nonlocal bodies
            if message["type"] == "http.response.body":
                bodies += 1
                if bodies == 2:
                    raise RuntimeError("simulated failure while relaying")
            await send(message)

        await self.app(scope, receive, failing_send)


def test_an_exception_while_relaying_a_stream_closes_the_engine_request(
    stub_engine: StubEngine, caplog: pytest.LogCaptureFixture
) -> None:
    app = ProxyApp(ProxyConfig(upstream=stub_engine.url, health_interval_s=0.05), KeyRing(KEYS))
    server = UvicornThread(_FailingSend(app)).start()
    try:
        wait_until(lambda: app.ready, what="readiness")
        slow = {**STREAM, "stub": {"tokens": 500, "token_delay_ms": 20}}
        with (
            httpx.Client(base_url=server.url, headers=AUTH, timeout=10) as c,
            pytest.raises(httpx.TransportError),  # uvicorn drops the broken response
            c.stream("POST", "/v1/chat/completions", json=slow) as r,
        ):
            for _ in r.iter_raw():
                pass
        wait_until(lambda: stub_engine.requests()[0]["cancelled"], what="the engine's cancel")
        assert stub_engine.requests()[0]["tokens_sent"] < 500
        assert app.metrics.in_flight == 0
        assert "proxy internal error" in caplog.text
    finally:
        server.stop()


def test_no_engine_connection_outlives_cancels_timeouts_and_failures(
    start_proxy: Callable[..., RunningProxy], stub_engine: StubEngine
) -> None:
    # one health poll at start, then none: the pool only changes through the requests below
    proxy = start_proxy(upstream_timeout_s=0.3, keepalive_s=0.1, health_interval_s=30)
    cases: list[dict[str, Any]] = [
        {**CHAT, "stub": {"first_token_delay_ms": 5000}},  # 504: no head in time
        {**CHAT, "stub": {"fail": "die_mid_body"}},  # 502
        {**CHAT, "stub": {"fail": "500"}},  # the engine's own error, passed through
        {**STREAM, "stub": {"fail": "die_mid_stream"}},  # SSE error event
        {**STREAM, "stub": {"fail": "pause_mid_event", "pause_s": 5}},  # silent mid-event
        {**CHAT, "stub": {"tokens": 3000}},  # a large-ish body, read whole
    ]
    with proxy.client(headers=AUTH) as c:
        for body in cases:
            c.post("/v1/chat/completions", json=body)
        for _ in range(3):  # clients that leave mid-stream
            slow = {**STREAM, "stub": {"tokens": 500, "token_delay_ms": 20}}
            with c.stream("POST", "/v1/chat/completions", json=slow) as r:
                next(r.iter_raw())
        assert c.get("/v1/models").status_code == 200  # a clean exchange: its connection stays
    wait_until(lambda: proxy.app.metrics.in_flight == 0, what="in-flight to drain")
    # Every connection the engine still holds is an idle one in the proxy's pool.
    wait_until(
        lambda: stub_engine.open_connections == proxy.app.client.idle_connections,
        what="engine-side connections to match the proxy's idle pool",
    )
    assert proxy.app.client.idle_connections >= 1
    assert len(stub_engine.requests()) == len(cases) + 4  # each reached the engine exactly once


def test_a_bug_while_relaying_an_answer_is_a_500_before_its_head(
    start_proxy: Callable[..., RunningProxy], stub_engine: StubEngine,
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    # The relay runs in the engine connection's callbacks (serving/proxy/relay.py): an
    # exception there must still reach the client as a failure, and end the request.
    proxy = start_proxy()

    def broken(*args: object) -> None:
        raise RuntimeError("simulated bug in the relay")

    monkeypatch.setattr(Relay, "_response_headers", broken)
    with proxy.client(headers=AUTH) as c:
        r = c.post("/v1/chat/completions", json=CHAT)
        assert r.status_code == 500
        wait_until(lambda: proxy.app.metrics.in_flight == 0, what="the request to end")
        monkeypatch.undo()
        assert c.post("/v1/chat/completions", json=CHAT).status_code == 200  # still serving
    assert proxy.app.metrics.requests[("chat_completions", "500", "alice")] == 1
    assert "proxy internal error" in caplog.text
    assert len(stub_engine.requests()) == 2


def test_a_bug_while_relaying_a_stream_cuts_it_and_cancels_the_engine(
    start_proxy: Callable[..., RunningProxy], stub_engine: StubEngine,
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    proxy = start_proxy()
    calls = 0
    real_scan = relay_module._HAS_TOKENS  # the usage scan: runs on every relayed event

    def scan_then_fail(data: bytes) -> re.Match[bytes] | None:
        nonlocal calls
        calls += 1
        if calls == 3:
            raise RuntimeError("simulated bug in the relay")
        return real_scan(data)

    monkeypatch.setattr(relay_module, "_HAS_TOKENS", scan_then_fail)
    slow = {**STREAM, "stub": {"tokens": 500, "token_delay_ms": 20}}
    with (
        proxy.client(headers=AUTH) as c,
        # cut at once: never a clean end of the stream, nor one left hanging (a read timeout)
        pytest.raises(httpx.RemoteProtocolError),
        c.stream("POST", "/v1/chat/completions", json=slow) as r,
    ):
        assert r.status_code == 200
        for _ in r.iter_raw():
            pass
    wait_until(lambda: stub_engine.requests()[0]["cancelled"], what="the engine's cancel")
    assert stub_engine.requests()[0]["tokens_sent"] < 500
    wait_until(lambda: proxy.app.metrics.in_flight == 0, what="the request to end")
    assert "proxy internal error" in caplog.text
