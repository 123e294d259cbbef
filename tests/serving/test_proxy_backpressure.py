"""Admission and retries: in-flight cap (streams count until they end), readiness, and retrying
only when the engine was never reached."""

from __future__ import annotations

import threading
from collections.abc import Callable

import httpx

from tests.harness.stub_engine import StubEngine, StubEngineProcess
from tests.serving.conftest import AUTH, CHAT, RunningProxy, wait_until

STREAM = {**CHAT, "stream": True}


def test_streams_count_against_the_cap_until_they_end(
    start_proxy: Callable[..., RunningProxy], stub_engine: StubEngine
) -> None:
    proxy = start_proxy(max_in_flight=2)
    # Each stream sends one token, then the engine goes quiet for 30 s.
    slow = {**STREAM, "stub": {"fail": "pause", "fail_after_tokens": 1, "pause_s": 30}}
    with proxy.client(headers=AUTH) as c:
        streams = [c.stream("POST", "/v1/chat/completions", json=slow) for _ in range(2)]
        responses = [s.__enter__() for s in streams]
        readers = [r.iter_raw() for r in responses]  # keep them: dropping one closes it
        for r, reader in zip(responses, readers, strict=True):
            assert r.status_code == 200
            assert next(reader).startswith(b"data: ")  # past the head and the first token
        assert proxy.app.metrics.in_flight == 2
        refused = c.post("/v1/chat/completions", json=CHAT)
        assert refused.status_code == 429
        assert refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["type"] == "rate_limit_error"
        assert len(stub_engine.requests()) == 2  # the refused one never reached the engine
        for s in streams:  # the client hangs up: the slots free up
            s.__exit__(None, None, None)
        wait_until(lambda: proxy.app.metrics.in_flight == 0, what="in-flight to drain")
        assert c.post("/v1/chat/completions", json=CHAT).status_code == 200
    assert proxy.app.metrics.requests[("chat_completions", "429", "alice")] == 1


def test_not_ready_engine_gets_503_with_retry_after_and_no_traffic(
    start_proxy: Callable[..., RunningProxy], stub_engine: StubEngine
) -> None:
    stub_engine.configure(health_status=503)  # the engine is still loading
    proxy = start_proxy(wait_ready=False)
    wait_until(lambda: stub_engine.app.health_hits >= 2, what="the proxy to poll /health")
    with proxy.client(headers=AUTH) as c:
        r = c.post("/v1/chat/completions", json=CHAT)
        assert r.status_code == 503
        assert r.headers["retry-after"] == "5"
        assert r.json()["error"]["code"] == "engine_not_ready"
        assert stub_engine.requests() == []
        stub_engine.configure(health_status=None)
        wait_until(lambda: proxy.app.ready, what="readiness")
        assert c.post("/v1/chat/completions", json=CHAT).status_code == 200


def test_slow_start_engine_becomes_ready_by_itself(
    start_proxy: Callable[..., RunningProxy],
) -> None:
    # Loading until told otherwise (a fixed startup delay could be over before the first
    # look on a busy machine): /health answers 503, then 200, and the proxy follows alone.
    with StubEngine(never_ready=True) as engine:
        proxy = start_proxy(wait_ready=False, upstream=engine.url)
        with proxy.client() as c:
            assert c.get("/ready").status_code == 503
            wait_until(lambda: engine.app.health_hits >= 2, what="the proxy to poll again")
            assert c.get("/ready").status_code == 503
            engine.behaviour.never_ready = False  # the weights are loaded
            wait_until(lambda: c.get("/ready").status_code == 200, what="the engine to warm up")


def test_engine_not_listening_yet_is_not_ready_until_it_listens(
    start_proxy: Callable[..., RunningProxy],
) -> None:
    engine = StubEngineProcess(listen_delay_s=1.2).start(wait_listening=False)
    try:
        proxy = start_proxy(wait_ready=False, upstream=engine.url)
        with proxy.client(headers=AUTH) as c:
            ready = c.get("/ready")
            assert ready.status_code == 503
            assert "cannot connect to the engine" in ready.json()["error"]["message"]
            assert c.post("/v1/chat/completions", json=CHAT).status_code == 503
            engine.wait_listening()
            wait_until(lambda: c.get("/ready").status_code == 200, what="readiness")
            assert c.post("/v1/chat/completions", json=CHAT).status_code == 200
        assert [r["path"] for r in engine.requests()] == ["/v1/chat/completions"]
    finally:
        engine.stop()


def test_connect_refused_is_retried_and_the_engine_sees_the_request_once(
    start_proxy: Callable[..., RunningProxy], stub_engine: StubEngine
) -> None:
    # Poll rarely so the proxy still believes the engine is up when it restarts.
    proxy = start_proxy(health_interval_s=30, connect_retries=8)
    proxy.app.client.close()  # no pooled connection: the next request must connect
    stub_engine.stop()  # refusing until the proxy has been refused (no race with a timer)
    answer: list[httpx.Response] = []

    def call() -> None:
        with proxy.client(headers=AUTH) as c:
            answer.append(c.post("/v1/chat/completions", json=CHAT))

    caller = threading.Thread(target=call)
    caller.start()
    wait_until(lambda: proxy.app.client.retries >= 1, what="a refused connect")
    stub_engine.start()  # the same port again
    caller.join(30)
    assert answer and answer[0].status_code == 200
    assert len(stub_engine.requests("/v1/chat/completions")) == 1
    assert proxy.app.metrics.connect_retries >= 1


def test_engine_down_after_retries_is_503_and_marks_not_ready(
    start_proxy: Callable[..., RunningProxy], stub_engine: StubEngine
) -> None:
    proxy = start_proxy(health_interval_s=30, connect_retries=1)
    proxy.app.client.close()
    stub_engine.stop()
    with proxy.client(headers=AUTH) as c:
        r = c.post("/v1/chat/completions", json=CHAT)
        assert r.status_code == 503
        assert r.headers["retry-after"] == "5"
        assert r.json()["error"]["code"] == "engine_unreachable"
        assert c.get("/ready").status_code == 503


def test_engine_failure_after_the_request_was_sent_is_never_retried(
    proxy: RunningProxy, stub_engine: StubEngine
) -> None:
    dying = {**CHAT, "stub": {"fail": "die_mid_body"}}
    with proxy.client(headers=AUTH) as c:
        r = c.post("/v1/chat/completions", json=dying)
        assert r.status_code == 502
        assert r.json()["error"]["code"] == "engine_failed"
        assert len(stub_engine.requests()) == 1  # sent once, not re-sent
        failing = c.post("/v1/chat/completions", json={**CHAT, "stub": {"fail": "500"}})
        assert failing.status_code == 500  # the engine's own error, passed through
        assert failing.json()["error"]["message"] == "stub: internal error on demand"
    assert len(stub_engine.requests()) == 2
    assert proxy.app.metrics.upstream_errors["broken"] == 1


def test_engine_too_slow_to_answer_is_504(
    start_proxy: Callable[..., RunningProxy], stub_engine: StubEngine
) -> None:
    proxy = start_proxy(upstream_timeout_s=0.2)
    slow = {**CHAT, "stub": {"first_token_delay_ms": 3000}}
    with proxy.client(headers=AUTH) as c:
        r = c.post("/v1/chat/completions", json=slow)
    assert r.status_code == 504
    assert r.json()["error"]["code"] == "engine_timeout"
    wait_until(lambda: stub_engine.requests()[0]["cancelled"], what="the engine to see the abort")
    assert isinstance(r, httpx.Response)
