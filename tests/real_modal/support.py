"""What the real-Modal tests share: the opt-in credentials, their skip mark, and cleanup.

These tests spend on a real workspace, so they never run by accident: they need a token given
only for them, `MODAL_REAL_TOKEN_ID` / `MODAL_REAL_TOKEN_SECRET` (never the plain
`MODAL_TOKEN_*`, which a developer's emulator env or personal token sets), and
`MODAL_SERVER_URL` unset or Modal's own API (`modal.config.DEFAULT_SERVER_URL`, so an emulator
URL left in the shell cannot be mistaken for Modal). Everything runs in a throwaway
environment `iac-test-<random>` and costs nothing: no GPU, no min_containers, no request to
the deployed app.

`destroying(server)` is the cleanup every test uses: a `with` block (its `finally`) that
destroys whatever the test's `Engine` still holds, in reverse creation order, even when the
test failed, and raises naming what could not be removed so it can be deleted by hand.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import pytest
from modal.config import DEFAULT_SERVER_URL

from tests.harness.provider_server import Engine, ProviderRef, ProviderServer

TOKEN_ID_VAR = "MODAL_REAL_TOKEN_ID"
TOKEN_SECRET_VAR = "MODAL_REAL_TOKEN_SECRET"
#: Modal's own API endpoints, as the installed client knows them (api.modal.com + fail-over).
MODAL_API_URLS = frozenset(u.strip().rstrip("/") for u in DEFAULT_SERVER_URL.split(","))
HOW_TO_RUN = (
    f"set {TOKEN_ID_VAR} and {TOKEN_SECRET_VAR} to a Modal token of a workspace where a"
    " throwaway environment may be created (MODAL_TOKEN_ID/MODAL_TOKEN_SECRET are ignored on"
    " purpose) and leave MODAL_SERVER_URL unset (or set it to Modal's"
    f" {DEFAULT_SERVER_URL})"
)


@dataclass(frozen=True)
class RealCredentials:
    token_id: str
    token_secret: str

    def __repr__(self) -> str:
        return "RealCredentials(<redacted>)"


def _server_url_is_modal(value: str) -> bool:
    parts = [p.strip().rstrip("/") for p in value.split(",") if p.strip()]
    return bool(parts) and all(p in MODAL_API_URLS for p in parts)


def skip_reason(environ: Mapping[str, str] | None = None) -> str | None:
    """Why the real-Modal tests cannot run here (None: they can), saying what to set."""
    env = os.environ if environ is None else environ
    token_id = env.get(TOKEN_ID_VAR, "")
    token_secret = env.get(TOKEN_SECRET_VAR, "")
    if not token_id and not token_secret:
        return f"real Modal tests need explicit credentials: {HOW_TO_RUN}"
    if not token_id or not token_secret:
        missing = TOKEN_ID_VAR if not token_id else TOKEN_SECRET_VAR
        return f"real Modal tests: {missing} is not set (both are needed): {HOW_TO_RUN}"
    server_url = env.get("MODAL_SERVER_URL", "")
    if server_url and not _server_url_is_modal(server_url):
        return (
            f"real Modal tests: MODAL_SERVER_URL={server_url} is not Modal's API (an emulator?):"
            f" unset it or set it to {DEFAULT_SERVER_URL}"
        )
    return None


def real_credentials() -> RealCredentials:
    """The opt-in token; skips the calling test when it is not (fully) given."""
    reason = skip_reason()
    if reason is not None:
        pytest.skip(reason)
    return RealCredentials(os.environ[TOKEN_ID_VAR], os.environ[TOKEN_SECRET_VAR])


_REASON = skip_reason()
#: `pytestmark` of every real-Modal test module: the marker, the skip with what to set, and a
#: timeout fit for real network calls and an image build.
REAL_MODAL = [
    pytest.mark.real_modal,
    pytest.mark.skipif(_REASON is not None, reason=_REASON or ""),
    pytest.mark.timeout(900),
]


def provider_env(creds: RealCredentials, modal_config_path: str) -> dict[str, str]:
    """Env of the provider process: this process's env without any MODAL_* setting (profile,
    environment, emulator URL, another token), plus the real token; the server URL is left to
    the default (Modal's API) and `~/.modal.toml` is replaced by an empty path, so nothing of a
    developer's own Modal setup takes part. The providers' retry tuning is kept."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("MODAL_") or k.startswith("MODAL_PROVIDER_")
    }
    env.update(
        {
            "MODAL_TOKEN_ID": creds.token_id,
            "MODAL_TOKEN_SECRET": creds.token_secret,
            "MODAL_CONFIG_PATH": modal_config_path,
        }
    )
    return env


def destroy_all(engine: Engine) -> list[str]:
    """Destroy every resource `engine` holds, newest first; returns what could not be."""
    failures: list[str] = []
    for name in reversed(list(engine.states)):
        st = engine.states[name]
        try:
            engine.destroy(name)
        except Exception as e:  # keep going: remove as much as possible
            failures.append(f"{name} ({st.id}): {type(e).__name__}: {e}")
    return failures


@contextlib.contextmanager
def destroying(server: ProviderServer) -> Iterator[Engine]:
    """A fresh Engine whose resources are all destroyed when the block ends, failed or not."""
    engine = Engine(server)
    try:
        yield engine
    finally:
        failures = destroy_all(engine)
        if failures:
            raise RuntimeError(
                "cleanup on real Modal failed; delete these by hand (modal CLI or dashboard):\n"
                + "\n".join(failures)
            )


def assert_diff_none(
    engine: Engine, name: str, provider: ProviderRef, inputs: Mapping[str, Any]
) -> None:
    """The no-op check: the same inputs again give Check without failures and Diff DIFF_NONE
    (no replace), the way `pulumi preview` on an unchanged program asks."""
    st = engine.states[name]
    chk = engine.server.check(provider, inputs, st.inputs, name=name)
    assert chk.failures == []
    d = engine.server.diff(provider, st.id, st.outputs, chk.inputs, old_inputs=st.inputs, name=name)
    assert (d.changes, d.replaces) == ("none", []), f"{name}: unchanged inputs gave {d}"
    assert engine.preview(name, provider, inputs) == "same"


def is_gone(
    server: ProviderServer,
    provider: ProviderRef,
    id_: str,
    outputs: Mapping[str, Any],
    inputs: Mapping[str, Any],
) -> bool:
    """A refresh of a destroyed resource (its last outputs) finds nothing on Modal."""
    return server.read(provider, id_, state=outputs, inputs=inputs).id == ""
