"""The opt-in gate of the real-Modal tests (support.py), checked everywhere (no marker: it
spends nothing): only MODAL_REAL_TOKEN_* enable them, never the plain MODAL_TOKEN_* of an
emulator env or a personal token, never with an emulator's MODAL_SERVER_URL; the provider
process gets the real token and none of the developer's own Modal settings."""

from __future__ import annotations

import pytest
from modal.config import DEFAULT_SERVER_URL

from tests.real_modal.support import RealCredentials, provider_env, skip_reason

REAL = {"MODAL_REAL_TOKEN_ID": "ak-real", "MODAL_REAL_TOKEN_SECRET": "as-real"}


def test_plain_modal_tokens_do_not_enable_the_tests() -> None:
    reason = skip_reason({"MODAL_TOKEN_ID": "ak-1", "MODAL_TOKEN_SECRET": "as-1"})
    assert reason is not None
    assert "MODAL_REAL_TOKEN_ID and MODAL_REAL_TOKEN_SECRET" in reason


@pytest.mark.parametrize("present", ["MODAL_REAL_TOKEN_ID", "MODAL_REAL_TOKEN_SECRET"])
def test_half_set_names_the_missing_variable(present: str) -> None:
    reason = skip_reason({present: "x"})
    missing = ({"MODAL_REAL_TOKEN_ID", "MODAL_REAL_TOKEN_SECRET"} - {present}).pop()
    assert reason is not None and f"{missing} is not set" in reason


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:8790", "https://api.modal.com,http://localhost:1", "grpc://x"]
)
def test_a_server_url_other_than_modals_keeps_them_off(url: str) -> None:
    reason = skip_reason({**REAL, "MODAL_SERVER_URL": url})
    assert reason is not None and f"MODAL_SERVER_URL={url}" in reason


@pytest.mark.parametrize(
    "url", ["", DEFAULT_SERVER_URL, "https://api.modal.com", "https://api.modal.com/"]
)
def test_real_tokens_with_modals_url_or_none_enable_them(url: str) -> None:
    env = {**REAL, "MODAL_SERVER_URL": url} if url else dict(REAL)
    assert skip_reason(env) is None


def test_provider_env_carries_only_the_real_token(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in {
        "MODAL_TOKEN_ID": "ak-personal",
        "MODAL_TOKEN_SECRET": "as-personal",
        "MODAL_SERVER_URL": "http://127.0.0.1:8790",
        "MODAL_PROFILE": "me",
        "MODAL_ENVIRONMENT": "prod",
        "MODAL_PROVIDER_RETRY_ATTEMPTS": "5",
    }.items():
        monkeypatch.setenv(key, value)
    env = provider_env(RealCredentials("ak-real", "as-real"), "/nonexistent/modal.toml")
    modal_vars = {k: v for k, v in env.items() if k.startswith("MODAL_")}
    assert modal_vars == {
        "MODAL_TOKEN_ID": "ak-real",
        "MODAL_TOKEN_SECRET": "as-real",
        "MODAL_CONFIG_PATH": "/nonexistent/modal.toml",
        "MODAL_PROVIDER_RETRY_ATTEMPTS": "5",
    }
    assert "as-real" not in repr(RealCredentials("ak-real", "as-real"))
