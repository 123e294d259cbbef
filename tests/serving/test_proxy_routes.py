"""Deny by default: which paths reach the engine, and which never do (raw bytes, no tricks)."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.harness.stub_engine import DANGEROUS_ROUTES, StubEngine
from tests.serving.conftest import AUTH, CHAT, RunningProxy, raw_http, raw_request, wait_until


def engine_hits(engine: StubEngine) -> list[str]:
    return [f"{r['method']} {r['raw_path']}" for r in engine.requests()]


def test_allowed_routes_reach_the_engine_with_a_key(
    proxy: RunningProxy, stub_engine: StubEngine
) -> None:
    with proxy.client(headers=AUTH) as c:
        assert c.get("/v1/models").json()["data"][0]["id"] == "stub-model"
        chat = c.post("/v1/chat/completions", json=CHAT)
        assert chat.status_code == 200
        assert chat.json()["choices"][0]["message"]["content"].startswith("tok0")
        assert c.post("/v1/completions", json={"model": "m", "prompt": "hi"}).status_code == 200
        emb = c.post("/v1/embeddings", json={"model": "m", "input": ["a", "b"]})
        assert len(emb.json()["data"]) == 2
    assert engine_hits(stub_engine) == [
        "GET /v1/models", "POST /v1/chat/completions", "POST /v1/completions",
        "POST /v1/embeddings",
    ]  # fmt: skip
    forwarded = stub_engine.requests("/v1/chat/completions")[0]
    # The client's key stays at the proxy; the body arrives byte for byte.
    assert "authorization" not in forwarded["headers"]
    assert json.loads(forwarded["body"]) == CHAT


def test_only_allowlisted_headers_reach_the_engine(
    proxy: RunningProxy, stub_engine: StubEngine
) -> None:
    sent = {
        **AUTH, "Content-Type": "text/plain", "Cookie": "session=1", "Modal-Key": "wk-x",
        "Modal-Secret": "ws-y", "X-Forwarded-For": "10.0.0.1", "traceparent": "00-ab-cd-01",
        "User-Agent": "test-agent",
    }  # fmt: skip
    with proxy.client() as c:
        assert c.post("/v1/chat/completions", content=json.dumps(CHAT), headers=sent).is_success
    headers = stub_engine.requests()[0]["headers"]
    assert headers["content-type"] == "application/json"  # validated JSON, labelled as such
    assert headers["traceparent"] == "00-ab-cd-01" and headers["user-agent"] == "test-agent"
    for name in ("authorization", "cookie", "modal-key", "modal-secret", "x-forwarded-for"):
        assert name not in headers


def test_the_stub_records_dangerous_routes_when_called_directly(stub_engine: StubEngine) -> None:
    # Proves the "never forwarded" tests below could see a forwarded request.
    response = raw_http(stub_engine.port, raw_request("POST", "/invocations", body=b"{}"))
    assert response.status == 200
    assert engine_hits(stub_engine) == ["POST /invocations"]


TRICKS = [
    "//v1/chat/completions", "/v1//chat/completions", "/v1/../metrics", "/v1/./chat/completions",
    "/v1/%2e%2e/metrics", "/v1/%2E%2E/invocations", "/%76%31/chat/completions",
    "/v1/chat%2fcompletions", "/V1/chat/completions", "/v1/Chat/Completions",
    "/v1/chat/completions/", "/v1/chat/completions;x", "/v1/chat/completions%00",
    "/v1/chat/completions/../../invocations", "/v1/models/../../sleep", "/v1/chat/completionsX",
    "/v1", "/", "/docs", "/openapi.json", "/v2/models", "/v1/responses", "/v1/load_lora_adapter",
    "/health/../invocations", "/ready/", "/metrics/",
]  # fmt: skip


@pytest.mark.parametrize("path", [*DANGEROUS_ROUTES, *TRICKS])
def test_everything_else_is_404_and_never_reaches_the_engine(
    shared_pair: tuple[RunningProxy, StubEngine], path: str
) -> None:
    proxy, stub_engine = shared_pair
    stub_engine.reset()
    for method in ("GET", "POST"):
        body = json.dumps(CHAT).encode() if method == "POST" else b""
        response = raw_http(proxy.port, raw_request(method, path, body=body, headers=AUTH))
        assert response.status == 404, (method, path, response)
        assert json.loads(response.body)["error"]["code"] == "route_not_found"
    assert engine_hits(stub_engine) == []


def test_wrong_method_is_405_and_not_forwarded(
    proxy: RunningProxy, stub_engine: StubEngine
) -> None:
    with proxy.client(headers=AUTH) as c:
        r = c.get("/v1/chat/completions")
        assert r.status_code == 405
        assert r.headers["allow"] == "POST"
        assert c.post("/v1/models", json={}).status_code == 405
        assert c.delete("/v1/models").status_code == 405
    assert engine_hits(stub_engine) == []


def test_query_strings_are_not_forwarded(proxy: RunningProxy, stub_engine: StubEngine) -> None:
    with proxy.client(headers=AUTH) as c:
        assert c.get("/v1/models?debug=1&x=../../invocations").status_code == 200
    [hit] = stub_engine.requests()
    assert (hit["raw_path"], hit["query"]) == ("/v1/models", "")


def test_health_is_open_and_metrics_needs_a_key(proxy: RunningProxy) -> None:
    with proxy.client() as c:
        assert c.get("/health").json() == {"status": "ok"}
        assert c.get("/ready").json() == {"ready": True}
        assert c.get("/metrics").status_code == 401
        assert c.get("/metrics", headers={"Authorization": "Bearer nope"}).status_code == 403
        metrics = c.get("/metrics", headers=AUTH)
    assert metrics.status_code == 200
    assert metrics.headers["content-type"].startswith("text/plain; version=0.0.4")
    assert 'proxy_requests_total{route="health",status="200",key="-"} 1' in metrics.text


def test_ready_follows_the_engine_health(proxy: RunningProxy, stub_engine: StubEngine) -> None:
    stub_engine.configure(health_status=503)
    with proxy.client() as c:
        wait_until(lambda: c.get("/ready").status_code == 503, what="/ready to turn 503")
        not_ready = c.get("/ready")
        assert not_ready.headers["retry-after"] == "5"
        assert not_ready.json()["error"]["code"] == "engine_not_ready"
        stub_engine.configure(health_status=None)
        wait_until(lambda: c.get("/ready").status_code == 200, what="/ready to turn 200")


def test_runs_on_plain_asyncio_and_h11(stub_engine: StubEngine) -> None:
    """Without uvloop/httptools (uvicorn's fallbacks) the behaviour is the same."""
    from serving.proxy import KeyRing, ProxyApp, ProxyConfig
    from tests.harness.stub_engine import UvicornThread
    from tests.serving.conftest import KEYS

    app = ProxyApp(ProxyConfig(upstream=stub_engine.url, health_interval_s=0.05), KeyRing(KEYS))
    server = UvicornThread(app, http="h11", loop="asyncio").start()
    try:
        wait_until(lambda: app.ready, what="readiness")
        with httpx.Client(base_url=server.url, headers=AUTH, timeout=10) as c:
            assert c.post("/v1/chat/completions", json=CHAT).status_code == 200
            stream = c.post("/v1/chat/completions", json={**CHAT, "stream": True})
            assert stream.content.endswith(b"data: [DONE]\n\n")
        tricks = ("//v1/chat/completions", "/v1/%2e%2e/metrics", "/V1/models")
        for path in tricks:
            assert raw_http(server.port, raw_request("GET", path, headers=AUTH)).status == 404
        assert [r["path"] for r in stub_engine.requests()] == ["/v1/chat/completions"] * 2
    finally:
        server.stop()
