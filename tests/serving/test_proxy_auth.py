"""API keys: named sha256 digests, constant-time check, 401 vs 403, names (never keys) in logs."""

from __future__ import annotations

import hmac
import json
import logging

import pytest

from serving.proxy import KeyConfigError, KeyRing, digest_of
from serving.proxy.keys import parse_bearer
from tests.harness.stub_engine import StubEngine
from tests.serving.conftest import ALICE, BOB, CHAT, KEYS, RunningProxy, raw_http, raw_request


@pytest.mark.parametrize(
    "headers",
    [
        {},
        {"Authorization": "Basic c2stYWxpY2U6"},
        {"Authorization": "Bearer"},
        {"Authorization": "Bearer "},
        {"Authorization": ALICE},
        {"Authorization": f"Token {ALICE}"},
        {"Authorization": f"Bearer {ALICE} extra"},
        {"Authorization": "Bearer k\u00e9y"},
        {"x-api-key": ALICE},  # not accepted: one way to present a key (docs/proxy.md)
    ],
    ids=["none", "basic", "empty", "blank", "no-scheme", "token", "junk", "non-ascii", "x-api-key"],
)
def test_missing_or_malformed_key_is_401(
    shared_pair: tuple[RunningProxy, StubEngine], headers: dict[str, str]
) -> None:
    proxy, engine = shared_pair
    engine.reset()
    request = raw_request("POST", "/v1/chat/completions", body=json.dumps(CHAT).encode(),
                          headers=headers)  # fmt: skip
    response = raw_http(proxy.port, request)
    assert response.status == 401
    assert response.headers["www-authenticate"] == "Bearer"
    error = json.loads(response.body)["error"]
    assert set(error) >= {"message", "type", "code"}
    assert engine.requests() == []


def test_two_authorization_headers_are_401(shared_pair: tuple[RunningProxy, StubEngine]) -> None:
    proxy, engine = shared_pair
    engine.reset()
    request = (
        b"GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
        + f"Authorization: Bearer {ALICE}\r\nAuthorization: Bearer {BOB}\r\n\r\n".encode()
    )
    assert raw_http(proxy.port, request).status == 401
    assert engine.requests() == []


@pytest.mark.parametrize(
    "key",
    ["sk-wrong", ALICE + "x", ALICE[:-1], ALICE.upper(), KEYS["alice"].removeprefix("sha256:")],
    ids=["other", "longer", "shorter", "upper", "the-digest"],
)
def test_wrong_key_is_403(shared_pair: tuple[RunningProxy, StubEngine], key: str) -> None:
    proxy, engine = shared_pair
    engine.reset()
    with proxy.client() as c:
        r = c.post("/v1/chat/completions", json=CHAT, headers={"Authorization": f"Bearer {key}"})
    assert r.status_code == 403
    assert r.json()["error"]["code"] == "invalid_api_key"
    assert engine.requests() == []


def test_every_named_key_works_and_its_name_tags_metrics_and_logs(
    proxy: RunningProxy, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="serving.proxy.access")
    with proxy.client() as c:
        for key in (ALICE, BOB, BOB):
            auth = {"Authorization": f"bearer {key}"}  # the scheme is case-insensitive
            assert c.post("/v1/chat/completions", json=CHAT, headers=auth).status_code == 200
    requests = proxy.app.metrics.requests
    assert requests[("chat_completions", "200", "alice")] == 1
    assert requests[("chat_completions", "200", "bob")] == 2
    logged = [json.loads(r.getMessage()) for r in caplog.records if r.name.endswith("access")]
    assert [entry["key"] for entry in logged] == ["alice", "bob", "bob"]
    everything = caplog.text
    for secret in (ALICE, BOB, *KEYS.values(), KEYS["alice"].removeprefix("sha256:")):
        assert secret not in everything


def test_key_check_compares_against_every_key_without_early_exit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ring = KeyRing({f"k{i}": digest_of(f"key-{i}") for i in range(5)})
    calls: list[int] = []
    real = hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        calls.append(1)
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", counting)
    assert ring.match(b"key-0") == "k0"  # first key matches ...
    assert len(calls) == 5  # ... yet all five digests were compared
    calls.clear()
    assert ring.match(b"nope") is None
    assert len(calls) == 5


def test_parse_bearer() -> None:
    assert parse_bearer(b"Bearer abc.DEF-123_~+/=") == b"abc.DEF-123_~+/="
    assert parse_bearer(b"BEARER abc") == b"abc"
    for bad in (
        None,
        b"",
        b"Bearer",
        b"Bearer a b",
        b"Basic abc",
        b"Bearer \xff",
        b"Bearer " + b"a" * 600,
    ):
        assert parse_bearer(bad) is None


@pytest.mark.parametrize(
    ("raw", "expect"),
    [
        (None, "not set"),
        ("", "not set"),
        ("{not json", "not valid JSON"),
        ('["sha256:00"]', "must be a JSON object"),
        ("{}", "empty object"),
        ('{"alice": "plaintext-key-value"}', "not 'sha256:'"),
        ('{"alice": "sha256:ABCDEF"}', "not 'sha256:'"),
        ('{"alice": 12345}', "JSON int"),
        ('{"bad name!": "sha256:' + "0" * 64 + '"}', "key name #1"),
    ],
)
def test_key_config_errors_say_what_is_wrong_without_the_value(
    raw: str | None, expect: str
) -> None:
    with pytest.raises(KeyConfigError) as info:
        KeyRing.from_json(raw)
    message = str(info.value)
    assert expect in message
    assert "SERVING_API_KEYS" in message
    assert "plaintext-key-value" not in message
    assert "ABCDEF" not in message


def test_valid_key_config_loads_names() -> None:
    ring = KeyRing.from_json(json.dumps(KEYS))
    assert ring.names == ["alice", "bob"]
    assert ring.match(ALICE.encode()) == "alice"
