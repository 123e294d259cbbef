"""ServiceUser provider, driven through the SDK's dynamic-provider server against the emulator.

Create/read/diff/update/delete; a rotation keeps the old token working until the new one is
used, then the next `up` (after a refresh) retires it and the old token is refused; a second
rotation before the first finished keeps the service user proven in use; drift by hand; the
token secret never in an error, a diff or a plain output; a service user's own token cannot
create service users.
"""

from __future__ import annotations

import time
from typing import Any

import modal
import pytest
from modal_proto import api_pb2

from components.modal import _rpc
from components.modal.service_user import ServiceUserProvider
from tests.harness.emulator import EmulatorProcess
from tests.harness.provider_server import (
    Engine,
    ProviderCallError,
    ProviderServer,
    Secret,
    iter_secret_strings,
    reveal,
    scan_for_leaks,
)
from tests.providers.helpers import rpc_delta, server_env

P = ServiceUserProvider()
SECRET_OUT = ("token_secret",)


def inputs(name: str = "dev-deploy", rotation: str = "", days: int | None = None) -> dict:
    out: dict[str, Any] = {"name": name, "rotation": rotation}
    if days is not None:
        out["expires_in_days"] = days
    return out


def use(emu: EmulatorProcess, token_id: str, secret: str) -> str:
    """Call Modal with that token (ClientHello, which every identity may call): "ok", or
    "refused" when Modal does not accept the token."""
    try:
        with modal.Client(emu.url, api_pb2.CLIENT_TYPE_CLIENT, (token_id, secret)) as client:
            client.hello()
    except modal.exception.AuthError:
        return "refused"
    return "ok"


def live_users() -> dict[str, str]:
    """{name: token id} of every service user in the workspace."""
    return {su.name: su.token_id for su in modal.Workspace.from_context().service_users.list()}


def creds(engine: Engine, name: str = "s") -> tuple[str, str]:
    st = engine.states[name]
    return st.outputs["token_id"], reveal(st.outputs["token_secret"])


def test_lifecycle(engine: Engine, modal_env: EmulatorProcess) -> None:
    assert engine.up("s", P, inputs(days=30), secret_outputs=SECRET_OUT) == "create"
    st = engine.states["s"]
    assert st.id == "dev-deploy"
    out = st.outputs
    assert out["token_id"].startswith("ak-") and isinstance(out["token_secret"], Secret)
    assert reveal(out["token_secret"]).startswith("as-")
    assert out["names"] == ["dev-deploy"] and out["current_name"] == "dev-deploy"
    assert out["generation"] == 0 and out["previous_name"] == ""
    assert out["last_used_at"] == 0.0 and out["created_at"] > 0
    assert out["expires_at"] == pytest.approx(out["created_at"] + 30 * 86400, abs=5)
    assert live_users() == {"dev-deploy": out["token_id"]}
    info = modal.Workspace.from_context().service_users.info("dev-deploy")
    assert info.environment_roles == {}  # a new service user may call nothing yet
    assert use(modal_env, *creds(engine)) == "ok"
    assert engine.refresh("s") == "update"  # last_used_at moved: it was used
    before = modal_env.rpc_counts()
    assert engine.preview("s", P, inputs(days=30)) == "same"
    assert rpc_delta(before, modal_env.rpc_counts()) == {}  # Diff never calls Modal
    engine.destroy("s")
    assert live_users() == {}
    assert use(modal_env, out["token_id"], reveal(out["token_secret"])) == "refused"


def test_create_is_sent_scoped() -> None:
    """`ServiceUserCreateRequest.scoped=True` and the caller's idempotency key."""
    sent: list[Any] = []

    class Stub:
        async def ServiceUserCreate(self, req: Any, **kw: Any) -> Any:
            sent.append((req, kw))
            return api_pb2.ServiceUserCreateResponse(
                token_id="ak-x", token_secret="as-y", service_user_id="su-z"
            )

    class Client:
        _stub = Stub()

    import asyncio

    out = asyncio.run(_rpc.service_user_create(Client(), "n", 3600, "key-1"))
    assert out == ("su-z", "ak-x", "as-y")
    req, kw = sent[0]
    assert req.scoped and req.name == "n" and req.expires_in_seconds == 3600
    assert kw == {"retry": None, "metadata": [("x-idempotency-key", "key-1")]}


def test_rotation_keeps_the_old_token_until_the_new_one_is_used(
    engine: Engine, srv: ProviderServer, modal_env: EmulatorProcess
) -> None:
    engine.up("s", P, inputs(), secret_outputs=SECRET_OUT)
    old = creds(engine)
    assert use(modal_env, *old) == "ok"
    engine.refresh("s")

    assert engine.preview("s", P, inputs(rotation="2026-12")) == "update"
    assert engine.up("s", P, inputs(rotation="2026-12"), secret_outputs=SECRET_OUT) == "update"
    out = engine.states["s"].outputs
    new = creds(engine)
    assert new[0] != old[0] and new[1] != old[1]
    assert out["current_name"] == "dev-deploy-1" and out["generation"] == 1
    assert out["previous_name"] == "dev-deploy" and out["previous_token_id"] == old[0]
    assert out["names"] == ["dev-deploy-1", "dev-deploy"]
    assert live_users() == {"dev-deploy": old[0], "dev-deploy-1": new[0]}
    assert use(modal_env, *old) == "ok"  # whatever holds the old token keeps working

    # Not used yet: refresh and up change nothing, and say why the previous one stays.
    assert engine.refresh("s") == "same"
    mark = len(srv.stderr_path.read_text())
    assert engine.up("s", P, inputs(rotation="2026-12"), secret_outputs=SECRET_OUT) == "same"
    said = srv.stderr_path.read_text()[mark:]
    assert "previous service user dev-deploy kept" in said and "not been used" in said
    assert set(live_users()) == {"dev-deploy", "dev-deploy-1"}

    # The new token is used: refresh sees it, the diff plans the retirement, up retires.
    assert use(modal_env, *new) == "ok"
    assert engine.refresh("s") == "update"
    mark = len(srv.stderr_path.read_text())
    assert engine.preview("s", P, inputs(rotation="2026-12")) == "update"
    said = srv.stderr_path.read_text()[mark:]
    assert "retire previous service user dev-deploy (new token in use since 20" in said
    assert engine.up("s", P, inputs(rotation="2026-12"), secret_outputs=SECRET_OUT) == "update"
    out = engine.states["s"].outputs
    assert out["previous_name"] == "" and out["names"] == ["dev-deploy-1"]
    assert live_users() == {"dev-deploy-1": new[0]}
    assert use(modal_env, *old) == "refused"  # the old token is revoked
    assert use(modal_env, *new) == "ok"
    assert creds(engine) == new  # the secret is kept in state through the update
    assert engine.preview("s", P, inputs(rotation="2026-12")) == "same"
    engine.destroy("s")
    assert live_users() == {}


@pytest.mark.parametrize("new_one_used", [False, True])
def test_second_rotation_keeps_the_service_user_in_use(
    engine: Engine, modal_env: EmulatorProcess, new_one_used: bool
) -> None:
    engine.up("s", P, inputs(), secret_outputs=SECRET_OUT)
    gen0 = creds(engine)
    engine.up("s", P, inputs(rotation="r1"), secret_outputs=SECRET_OUT)
    gen1 = creds(engine)
    if new_one_used:
        use(modal_env, *gen1)
    engine.up("s", P, inputs(rotation="r2"), secret_outputs=SECRET_OUT)
    out = engine.states["s"].outputs
    assert out["current_name"] == "dev-deploy-2" and out["generation"] == 2
    kept, gone = ("dev-deploy-1", gen0) if new_one_used else ("dev-deploy", gen1)
    assert out["previous_name"] == kept and out["names"] == ["dev-deploy-2", kept]
    assert set(live_users()) == {"dev-deploy-2", kept}
    assert use(modal_env, *gone) == "refused"
    engine.destroy("s")
    assert live_users() == {}


def test_drift_by_hand(engine: Engine, modal_env: EmulatorProcess) -> None:
    ws = modal.Workspace.from_context()
    engine.up("s", P, inputs(), secret_outputs=SECRET_OUT)
    engine.up("s", P, inputs(rotation="r1"), secret_outputs=SECRET_OUT)
    ws.service_users.delete("dev-deploy")  # the previous one, by hand
    assert engine.refresh("s") == "update"
    assert engine.states["s"].outputs["previous_name"] == ""
    assert engine.states["s"].outputs["names"] == ["dev-deploy-1"]
    assert engine.preview("s", P, inputs(rotation="r1")) == "same"

    ws.service_users.delete("dev-deploy-1")  # the current one: gone
    assert engine.refresh("s") == "delete"
    assert engine.up("s", P, inputs(rotation="r1"), secret_outputs=SECRET_OUT) == "create"
    assert set(live_users()) == {"dev-deploy"}

    # Recreated by hand under the same name: another token, the recorded secret is void.
    ws.service_users.delete("dev-deploy")
    ws.service_users.create("dev-deploy", expires_in=None)
    assert engine.refresh("s") == "delete"


def test_name_taken_and_secrets_never_shown(
    engine: Engine, srv: ProviderServer, modal_env: EmulatorProcess
) -> None:
    ws = modal.Workspace.from_context()
    engine.up("s", P, inputs(), secret_outputs=SECRET_OUT)
    secret = creds(engine)[1]
    ws.service_users.create("dev-deploy-1", expires_in=None)  # the rotation's name, taken
    with pytest.raises(ProviderCallError) as ei:
        engine.up("s", P, inputs(rotation="r1"), secret_outputs=SECRET_OUT)
    msg = ei.value.message
    assert "ServiceUser 'dev-deploy' (dev-deploy): rotate failed" in msg
    assert "modal workspace service-users delete dev-deploy-1" in msg
    assert engine.states["s"].outputs["token_secret"]  # the state still holds the old one
    with pytest.raises(ProviderCallError) as taken:
        engine.up("t", P, inputs("dev-deploy-1"), secret_outputs=SECRET_OUT)
    assert "already exists in the workspace and is not managed" in taken.value.message
    ws.service_users.delete("dev-deploy-1")
    engine.up("s", P, inputs(rotation="r1"), secret_outputs=SECRET_OUT)
    secrets = [secret, *iter_secret_strings(engine.states["s"].outputs)]
    plain_outputs = {k: v for k, v in engine.states["s"].outputs.items() if k != "token_secret"}
    surfaces = {
        "errors": msg + taken.value.details,
        "provider stderr": srv.stderr_path.read_text(),
        "plain outputs": repr(plain_outputs),
        "engine-visible": repr([v for _, v in srv.visible]),
    }
    assert scan_for_leaks(surfaces, secrets) == []


def test_a_service_users_token_cannot_create_service_users(
    engine: Engine, emulator: EmulatorProcess
) -> None:
    engine.up("s", P, inputs(), secret_outputs=SECRET_OUT)
    token_id, secret = creds(engine)
    env = server_env(emulator, MODAL_TOKEN_ID=token_id, MODAL_TOKEN_SECRET=secret)
    with ProviderServer(env=env).start() as other, pytest.raises(ProviderCallError) as ei:
        Engine(other).up("x", P, inputs("other"))
    msg = ei.value.message
    assert "PermissionDenied" in msg and "Owner or Manager" in msg
    assert secret not in ei.value.details


def test_create_answer_lost_is_resolved(engine: Engine, modal_env: EmulatorProcess) -> None:
    """ServiceUserCreate applied, its answer lost: the retry returns the token of the one
    service user made (the emulator replays the idempotency key), never a second one."""
    modal_env._request(
        "POST",
        "/_emulator/faults",
        {"method": "ServiceUserCreate", "when": "after", "status": "UNAVAILABLE"},
    )
    engine.up("s", P, inputs(), secret_outputs=SECRET_OUT)
    assert live_users() == {"dev-deploy": engine.states["s"].outputs["token_id"]}
    assert use(modal_env, *creds(engine)) == "ok"


def test_check_failures(srv: ProviderServer) -> None:
    bad = srv.check(P, {"name": "a b", "rotation": 3, "expires_in_days": 0}).failures
    assert sorted(p for p, _ in bad) == ["expires_in_days", "name", "rotation"]
    assert srv.check(P, {"name": "x" * 57}).failures  # no room for the rotation suffix
    ok = srv.check(P, {"name": "dev-deploy", "expires_in_days": 365.0})
    assert ok.failures == [] and ok.inputs["expires_in_days"] == 365


def test_expiry_change_rotates(engine: Engine, modal_env: EmulatorProcess) -> None:
    engine.up("s", P, inputs(days=30), secret_outputs=SECRET_OUT)
    assert engine.up("s", P, inputs(days=60), secret_outputs=SECRET_OUT) == "update"
    out = engine.states["s"].outputs
    assert out["current_name"] == "dev-deploy-1" and out["previous_name"] == "dev-deploy"
    assert out["expires_at"] == pytest.approx(time.time() + 60 * 86400, abs=30)
    assert engine.up("s", P, inputs("other", days=60), secret_outputs=SECRET_OUT) == "replace"
    assert set(live_users()) == {"other"}
