"""Request ids, the overhead header, JSON access logs and the Prometheus metrics."""

from __future__ import annotations

import hashlib
import json
import logging
import re

import pytest

from serving.proxy.app import ROUTES, path_fingerprint
from serving.proxy.exchange import Exchange
from serving.proxy.metrics import Metrics
from serving.proxy.relay import scan_usage
from tests.harness.stub_engine import StubEngine
from tests.serving.conftest import (
    ALICE,
    AUTH,
    BOB,
    CHAT,
    KEYS,
    RunningProxy,
    raw_http,
    raw_request,
    wait_until,
)


def test_request_id_is_accepted_propagated_and_echoed(
    proxy: RunningProxy, stub_engine: StubEngine
) -> None:
    with proxy.client(headers=AUTH) as c:
        given = c.post("/v1/chat/completions", json=CHAT, headers={"X-Request-Id": "trace-42.a:b"})
        unsafe = c.post("/v1/chat/completions", json=CHAT, headers={"X-Request-Id": "a b\tc"})
        generated = c.post("/v1/chat/completions", json=CHAT)
        refused = c.get("/nope", headers={"X-Request-Id": "err-7"})
    assert given.headers["x-request-id"] == "trace-42.a:b"
    assert refused.headers["x-request-id"] == "err-7"
    forwarded = [r["headers"]["x-request-id"] for r in stub_engine.requests()]
    assert forwarded[0] == "trace-42.a:b"
    # unsafe or missing ids are replaced by a fresh one, the same on both sides
    for response, sent in ((unsafe, forwarded[1]), (generated, forwarded[2])):
        assert re.fullmatch(r"[0-9a-f]{24}", response.headers["x-request-id"])
        assert sent == response.headers["x-request-id"]
    assert forwarded[1] != forwarded[2]


def test_overhead_header_on_every_response(proxy: RunningProxy) -> None:
    with proxy.client(headers=AUTH) as c:
        responses = [
            c.post("/v1/chat/completions", json=CHAT),
            c.post("/v1/chat/completions", json={**CHAT, "stream": True}),
            c.get("/v1/models"),
            c.get("/health"),
            c.get("/nope"),
            c.post("/v1/chat/completions", content=b"{"),
        ]
    for r in responses:
        value = r.headers["x-proxy-overhead-ms"]
        assert re.fullmatch(r"\d+\.\d{3}", value), value
    overhead = proxy.app.metrics.overhead.series[("chat_completions",)]
    assert overhead[-1] == 3  # three chat requests observed in the overhead histogram


def test_access_log_is_one_json_line_per_request(
    proxy: RunningProxy, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="serving.proxy.access")
    with proxy.client() as c:
        c.post("/v1/chat/completions", json=CHAT, headers={**AUTH, "X-Request-Id": "log-1"})
        c.post("/v1/chat/completions", json={**CHAT, "stream": True,
               "stream_options": {"include_usage": True}}, headers=AUTH)  # fmt: skip
        c.get("/tokenize", headers=AUTH)
        c.post("/v1/chat/completions", json=CHAT, headers={"Authorization": "Bearer bad"})
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "serving.proxy.access"]
    assert [(e["route"], e["status"], e["key"]) for e in lines] == [
        ("chat_completions", 200, "alice"), ("chat_completions", 200, "alice"),
        ("unmatched", 404, "-"), ("chat_completions", 403, "-"),
    ]  # fmt: skip
    first, stream = lines[0], lines[1]
    assert first["request_id"] == "log-1"
    assert first["prompt_tokens"] == 3 and first["completion_tokens"] == 4
    assert stream["stream"] is True and stream["ttft_ms"] is not None
    assert stream["completion_tokens"] == 4
    for entry in lines:
        assert {"ts", "method", "path", "duration_ms", "overhead_ms", "error"} <= set(entry)
    assert "sk-alice" not in caplog.text


def test_metrics_exposition(proxy: RunningProxy, stub_engine: StubEngine) -> None:
    held = {
        **CHAT,
        "stream": True,
        "stub": {"fail": "pause", "fail_after_tokens": 1, "pause_s": 30},
    }
    with proxy.client(headers=AUTH) as c:
        c.post("/v1/chat/completions", json={**CHAT, "stream": True})
        c.post("/v1/embeddings", json={"model": "m", "input": "x"})
        with c.stream("POST", "/v1/chat/completions", json=held) as r:
            reader = r.iter_raw()
            next(reader)
            during = c.get("/metrics").text
        wait_until(lambda: proxy.app.metrics.in_flight == 0, what="in-flight to drain")
        after = c.get("/metrics").text
    assert "proxy_in_flight 1" in during
    assert "proxy_in_flight 0" in after
    assert "proxy_engine_ready 1" in after
    assert 'proxy_requests_total{route="chat_completions",status="200",key="alice"} 1' in after
    assert 'proxy_requests_total{route="embeddings",status="200",key="alice"} 1' in after
    assert 'proxy_request_duration_seconds_count{route="embeddings"} 1' in after
    assert 'proxy_time_to_first_token_seconds_count{route="chat_completions"} 2' in after
    assert 'proxy_tokens_total{key="alice",kind="prompt"} 1' in after
    assert re.search(
        r'proxy_request_duration_seconds_bucket\{route="embeddings",le="\+Inf"\} 1', after
    )
    # every sample line is "name{labels} value"
    for line in after.splitlines():
        if line and not line.startswith("#"):
            assert re.fullmatch(
                r'[a-z_]+(\{[a-z_]+="[^"]*"(,[a-z_]+="[^"]*")*\})? [0-9.e+-]+', line
            ), line


def test_a_bug_in_the_proxy_is_counted_and_logged_as_an_internal_error(
    proxy: RunningProxy, stub_engine: StubEngine, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    def broken(*args: object) -> bool:
        raise RuntimeError("simulated bug")

    monkeypatch.setattr(proxy.app, "_validate", broken)
    caplog.set_level(logging.INFO, logger="serving.proxy")
    with proxy.client(headers=AUTH) as c:
        r = c.post("/v1/chat/completions", json=CHAT)
    assert r.status_code == 500  # the server's own answer to an exception in the app
    assert proxy.app.metrics.requests[("chat_completions", "500", "alice")] == 1
    assert stub_engine.requests() == []
    assert proxy.app.metrics.in_flight == 0
    logged = [json.loads(x.getMessage()) for x in caplog.records if x.name.endswith("access")]
    assert logged[-1]["error"] == "proxy_internal_error: RuntimeError"


def test_metric_counts_stay_exact_past_a_million() -> None:
    metrics = Metrics()
    for _ in range(1_000_003):
        metrics.latency.observe(("chat_completions",), 0.003)
    text = metrics.render().decode()
    name = "proxy_request_duration_seconds"
    assert f'{name}_count{{route="chat_completions"}} 1000003\n' in text
    assert f'{name}_bucket{{route="chat_completions",le="+Inf"}} 1000003\n' in text
    assert "e+06" not in text


def test_no_key_or_digest_in_metrics_or_error_bodies(proxy: RunningProxy) -> None:
    near_miss = ALICE + "x"
    with proxy.client() as c:
        wrong = {"Authorization": f"Bearer {near_miss}"}
        bodies = [
            c.post("/v1/chat/completions", json=CHAT, headers=wrong).text,
            c.get("/v1/models", headers={"Authorization": f"Basic {ALICE}"}).text,
            c.post("/v1/chat/completions", json=CHAT, headers=AUTH).text,
        ]
        metrics = c.get("/metrics", headers=AUTH).text
    for secret in (ALICE, BOB, near_miss, *KEYS.values(), KEYS["alice"].removeprefix("sha256:")):
        assert secret not in metrics
        assert all(secret not in body for body in bodies)
    assert 'key="alice"' in metrics and 'key="-"' in metrics


def test_usage_numbers_that_are_not_token_counts_are_ignored() -> None:
    ex = Exchange(0.0, ROUTES[b"/v1/completions"], b"id", "POST", b"/v1/completions")
    scan_usage(b'{"usage": {"prompt_tokens": ' + b"9" * 5000 + b"}}", ex)  # no crash
    scan_usage(b'{"prompt_tokens": 1.5e3, "completion_tokens": 12}', ex)
    assert (ex.prompt_tokens, ex.completion_tokens) == (None, 12)
    # A model that writes `"prompt_tokens": 999` in its text: in the JSON answer the quotes
    # are escaped, so that is not a key; the real usage object after it is.
    ex = Exchange(0.0, ROUTES[b"/v1/completions"], b"id", "POST", b"/v1/completions")
    answer = {
        "choices": [{"text": 'say "prompt_tokens": 999 and "completion_tokens":7'}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 4},
    }
    scan_usage(json.dumps(answer).encode(), ex)
    assert (ex.prompt_tokens, ex.completion_tokens) == (3, 4)
    # A key that only ends like one: `{"\"prompt_tokens": 5}` is the key `"prompt_tokens`.
    ex = Exchange(0.0, ROUTES[b"/v1/completions"], b"id", "POST", b"/v1/completions")
    scan_usage(json.dumps({'"prompt_tokens': 5}).encode(), ex)
    assert (ex.prompt_tokens, ex.completion_tokens) == (None, None)


def test_unmatched_paths_are_logged_as_a_fingerprint_never_as_text(
    proxy: RunningProxy, stub_engine: StubEngine, caplog: pytest.LogCaptureFixture
) -> None:
    """A client that puts its key in the URL path must not find it in the access log."""
    caplog.set_level(logging.INFO, logger="serving.proxy.access")
    leaky = [
        f"/v1/{ALICE}/chat/completions",
        f"/{ALICE}",
        f"/v1/chat/completions/{ALICE}" + "x" * 300,  # past the old 200-character cut
        f"/v1/chat/completions%2F{ALICE}",
    ]
    for path in leaky:
        sent = raw_request("GET", path, headers=AUTH)
        assert raw_http(proxy.port, sent).status == 404
    with proxy.client(headers=AUTH) as c:
        c.post("/v1/chat/completions", json=CHAT)
        c.get("/v1/chat/completions")  # a known path with the wrong method: 405
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "serving.proxy.access"]
    assert [(e["route"], e["status"]) for e in lines] == [("unmatched", 404)] * 4 + [
        ("chat_completions", 200), ("chat_completions", 405),
    ]  # fmt: skip
    for entry, path in zip(lines, leaky, strict=False):
        raw = path.encode()
        assert entry["path"] is None and entry["path_len"] == len(raw)
        assert entry["path_sha256"] == hashlib.sha256(raw).hexdigest()[:16]
        assert entry["path_sha256"] == path_fingerprint(raw)
    for entry in lines[4:]:
        assert entry["path"] == "/v1/chat/completions" and entry["path_sha256"] is None
    assert len({e["path_sha256"] for e in lines[:4]}) == 4
    for secret in (ALICE, ALICE[3:], "sk-alice"):
        assert secret not in caplog.text
    # nothing unmatched went to the engine: it saw only the one valid request
    assert [r["raw_path"] for r in stub_engine.requests()] == ["/v1/chat/completions"]
