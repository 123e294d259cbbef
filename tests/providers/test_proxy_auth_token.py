"""ProxyAuthToken provider, driven through the engine protocol against the emulator."""

from __future__ import annotations

import modal
import pytest

from components.modal.proxy_auth_token import ProxyAuthTokenProvider
from tests.harness.emulator import EmulatorProcess
from tests.harness.provider_server import (
    Engine,
    ProviderCallError,
    ProviderServer,
    Secret,
    lifecycle,
    reveal,
)
from tests.providers.helpers import rpc_delta

P = ProxyAuthTokenProvider()
SECRET_OUT = ("token_secret",)  # the resource's additional_secret_outputs


def inputs(
    name: str = "gateway", envs: list[str] | None = None, rotation: str = ""
) -> dict[str, object]:
    return {
        "name": name,
        "environments": envs if envs is not None else ["main"],
        "rotation": rotation,
    }


def tokens_in(env: str) -> set[str]:
    ws = modal.Workspace.from_context()
    return {t.token_id for t in ws.proxy_tokens.list(environment_name=env)}


def all_tokens() -> dict[str, str]:
    return {t.token_id: t.name for t in modal.Workspace.from_context().proxy_tokens.list()}


def test_lifecycle_secret_output_from_creation(engine: Engine, modal_env: EmulatorProcess) -> None:
    modal.Environment.objects.create("dev")
    steps = lifecycle(
        engine,
        "t",
        P,
        inputs(),
        inputs("gateway-2", ["dev"]),
        secret_outputs=SECRET_OUT,
        destroy=False,
    )
    assert steps == ["create", "same", "same", "update"]
    st = engine.states["t"]
    assert st.id.startswith("wk-") and st.outputs["token_id"] == st.id
    assert isinstance(st.outputs["token_secret"], Secret)
    assert reveal(st.outputs["token_secret"]).startswith("ws-")
    assert all_tokens() == {st.id: "gateway-2"}
    assert tokens_in("dev") == {st.id} and tokens_in("main") == set()
    engine.destroy("t")
    assert all_tokens() == {}


def test_rotation_replaces_create_before_delete(
    engine: Engine, srv: ProviderServer, modal_env: EmulatorProcess
) -> None:
    engine.up("t", P, inputs(), secret_outputs=SECRET_OUT)
    old_id = engine.states["t"].id
    old_secret = reveal(engine.states["t"].outputs["token_secret"])
    assert engine.preview("t", P, inputs(rotation="2026-12")) == "replace"
    n = len(srv.records)
    assert engine.up("t", P, inputs(rotation="2026-12"), secret_outputs=SECRET_OUT) == "replace"
    calls = [r.method for r in srv.records[n:] if r.method in ("Create", "Delete")]
    assert calls == ["Create", "Delete"]  # the new token exists before the old one goes
    new = engine.states["t"]
    assert new.id != old_id and reveal(new.outputs["token_secret"]) != old_secret
    assert tokens_in("main") == {new.id}
    assert set(all_tokens()) == {new.id}


def test_import_drift_and_noop(engine: Engine, modal_env: EmulatorProcess) -> None:
    ws = modal.Workspace.from_context()
    tok = ws.proxy_tokens.create(name="external")
    ws.proxy_tokens.allow(tok.token_id, "main")
    st = engine.import_("t", P, tok.token_id, inputs("external"))
    assert st.outputs["allowed_environments"] == ["main"]
    assert "token_secret" not in st.outputs  # Modal never returns it again: rotate to get one
    before = modal_env.rpc_counts()
    assert engine.preview("t", P, inputs("external")) == "same"
    assert rpc_delta(before, modal_env.rpc_counts()) == {}
    ws.proxy_tokens.revoke(tok.token_id, "main")
    assert engine.refresh("t") == "update"
    assert engine.up("t", P, inputs("external")) == "update"
    assert tokens_in("main") == {tok.token_id}
    ws.proxy_tokens.delete(tok.token_id)
    assert engine.refresh("t") == "delete"


def test_unknown_environment_fails_create_without_leaving_a_token(
    engine: Engine, modal_env: EmulatorProcess
) -> None:
    with pytest.raises(ProviderCallError) as ei:
        engine.up("t", P, inputs(envs=["main", "nope"]))
    assert "ProxyAuthToken 'gateway'" in ei.value.details and "create failed" in ei.value.details
    assert all_tokens() == {}  # create is transactional


def test_check_failures(srv: ProviderServer) -> None:
    f = srv.check(P, {"name": "", "environments": ["en-bad"], "rotation": 3}).failures
    assert sorted(p for p, _ in f) == ["environments", "name", "rotation"]


def test_grants_added_outside_pulumi_show_on_refresh(
    engine: Engine, modal_env: EmulatorProcess
) -> None:
    """Review finding 13: read lists every environment the token is allowed in, not only the
    declared ones (the emulator lacks WebhookTokenEnvironmentList: the fallback asks every
    environment)."""
    modal.Environment.objects.create("dev")
    engine.up("t", P, inputs(), secret_outputs=SECRET_OUT)
    modal.Workspace.from_context().proxy_tokens.allow(engine.states["t"].id, "dev")
    assert engine.refresh("t") == "update"
    assert engine.states["t"].outputs["allowed_environments"] == ["dev", "main"]
    assert engine.preview("t", P, inputs()) == "update"
    engine.up("t", P, inputs(), secret_outputs=SECRET_OUT)
    assert tokens_in("dev") == set() and tokens_in("main") == {engine.states["t"].id}
