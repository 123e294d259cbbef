"""EnvironmentRole provider, driven through the SDK's dynamic-provider server against the emulator.

Create/read/diff/update/delete of a service user's role in one environment; the role follows a
ServiceUser through a rotation (both names hold it, then the retired one leaves the list);
drift by hand (role changed, revoked, service user deleted); what each role lets the token do
(the emulator's role matrix: `EnvironmentGetBudget` for viewer and contributor now; the writes
wait on the emulator's full matrix, dev/emulator/models/rbac.py, and are skipped until it exists).
"""

from __future__ import annotations

from typing import Any

import modal
import pytest
from modal_proto import api_pb2

from components.modal.environment_role import EnvironmentRoleProvider
from components.modal.service_user import ServiceUserProvider
from tests.harness.emulator import PROJECT_ROOT, EmulatorProcess
from tests.harness.provider_server import Engine, ProviderCallError, ProviderServer, reveal
from tests.providers.helpers import rpc_delta, server_env

P = EnvironmentRoleProvider()
SU = ServiceUserProvider()
RBAC_MATRIX = (PROJECT_ROOT / "dev" / "emulator" / "models" / "rbac.py").exists()
needs_matrix = pytest.mark.skipif(
    not RBAC_MATRIX,
    reason="waits on the emulator's role matrix (dev/emulator/models/rbac.py, a parallel change)",
)


def role(
    user: str = "ci", env: str = "dev", role_: str = "contributor", users: list[str] | None = None
) -> dict[str, Any]:
    return {"service_user": user, "environment": env, "role": role_, "service_users": users or []}


def roles_of(name: str) -> dict[str, str]:
    return dict(modal.Workspace.from_context().service_users.info(name).environment_roles)


def budget_read(emu: EmulatorProcess, token: tuple[str, str], env: str) -> str:
    """Read `env`'s budget with `token` (what the spend watcher does): "ok" or
    "PermissionDenied"."""
    from modal._utils.async_utils import synchronizer
    from modal.client import _Client

    env_id = next(e["id"] for e in emu.state()["environments"] if e["name"] == env)

    async def go() -> None:
        client = _Client(emu.url, api_pb2.CLIENT_TYPE_CLIENT, token)
        try:
            await client._open()
            await client._stub.EnvironmentGetBudget(
                api_pb2.EnvironmentGetBudgetRequest(environment_id=env_id)
            )
        finally:
            await client.close()

    try:
        synchronizer.create_blocking(go)()
    except modal.exception.PermissionDeniedError:
        return "PermissionDenied"
    return "ok"


@pytest.fixture
def ci(modal_env: EmulatorProcess) -> tuple[str, str]:
    """A service user 'ci' (made by hand) and an environment 'dev'; its token."""
    modal.Environment.objects.create("dev")
    data = modal.Workspace.from_context().service_users.create("ci", expires_in=None)
    return data.token_id, data.token_secret


def test_lifecycle(engine: Engine, modal_env: EmulatorProcess, ci: tuple[str, str]) -> None:
    assert engine.up("r", P, role()) == "create"
    st = engine.states["r"]
    assert st.id == "dev/ci"
    assert st.outputs["granted"] == {"ci": "contributor"}
    assert roles_of("ci") == {"dev": "contributor"}
    assert engine.refresh("r") == "same"
    before = modal_env.rpc_counts()
    assert engine.preview("r", P, role()) == "same"
    assert rpc_delta(before, modal_env.rpc_counts()) == {}
    assert engine.up("r", P, role(role_="viewer")) == "update"
    assert roles_of("ci") == {"dev": "viewer"}
    engine.destroy("r")
    assert roles_of("ci") == {}


def test_environment_change_replaces(
    engine: Engine, modal_env: EmulatorProcess, ci: tuple[str, str]
) -> None:
    engine.up("r", P, role())
    modal.Environment.objects.create("prod")
    assert engine.preview("r", P, role(env="prod")) == "replace"
    assert engine.up("r", P, role(env="prod")) == "replace"
    assert roles_of("ci") == {"prod": "contributor"}


def test_drift_by_hand(engine: Engine, modal_env: EmulatorProcess, ci: tuple[str, str]) -> None:
    ws = modal.Workspace.from_context()
    engine.up("r", P, role())
    ws.service_users.set_role("ci", "dev", role="viewer")
    assert engine.refresh("r") == "update"
    assert engine.states["r"].inputs["role"] == "viewer"
    assert engine.up("r", P, role()) == "update"
    assert roles_of("ci") == {"dev": "contributor"}
    ws.service_users.set_role("ci", "dev", role="no-access")
    assert engine.refresh("r") == "update"
    assert engine.states["r"].inputs["role"] == "no-access"
    assert engine.up("r", P, role()) == "update"
    assert roles_of("ci") == {"dev": "contributor"}
    ws.service_users.delete("ci")
    assert engine.refresh("r") == "delete"


def test_follows_a_rotation(engine: Engine, modal_env: EmulatorProcess) -> None:
    """Wired like the access stack: the role goes to the ServiceUser's `names`."""
    modal.Environment.objects.create("dev")
    engine.up("su", SU, {"name": "dev-deploy"}, secret_outputs=("token_secret",))

    def grant() -> str:
        names = engine.states["su"].outputs["names"]
        return engine.up("r", P, role("dev-deploy", users=names))

    assert grant() == "create"
    engine.up("su", SU, {"name": "dev-deploy", "rotation": "r1"}, secret_outputs=("token_secret",))
    assert grant() == "update"
    assert roles_of("dev-deploy") == roles_of("dev-deploy-1") == {"dev": "contributor"}
    new = engine.states["su"].outputs
    with modal.Client(
        modal_env.url,
        api_pb2.CLIENT_TYPE_CLIENT,
        (new["token_id"], reveal(new["token_secret"])),
    ) as client:
        client.hello()  # the new token is in use
    engine.refresh("su")
    engine.up("su", SU, {"name": "dev-deploy", "rotation": "r1"}, secret_outputs=("token_secret",))
    assert grant() == "update"  # the retired name leaves the list (already deleted: fine)
    assert engine.states["r"].outputs["granted"] == {"dev-deploy-1": "contributor"}
    assert engine.preview("r", P, role("dev-deploy", users=["dev-deploy-1"])) == "same"
    engine.destroy("r")
    assert roles_of("dev-deploy-1") == {}


def test_a_removed_name_that_still_exists_is_revoked(
    engine: Engine, modal_env: EmulatorProcess, ci: tuple[str, str]
) -> None:
    modal.Workspace.from_context().service_users.create("ci-old", expires_in=None)
    engine.up("r", P, role(users=["ci", "ci-old"]))
    assert roles_of("ci-old") == {"dev": "contributor"}
    engine.up("r", P, role(users=["ci"]))
    assert roles_of("ci-old") == {} and roles_of("ci") == {"dev": "contributor"}


def test_viewer_reads_its_environment_only(
    engine: Engine, modal_env: EmulatorProcess, ci: tuple[str, str]
) -> None:
    assert budget_read(modal_env, ci, "dev") == "PermissionDenied"  # no role: nothing
    engine.up("r", P, role(role_="viewer"))
    assert budget_read(modal_env, ci, "dev") == "ok"
    assert budget_read(modal_env, ci, "main") == "PermissionDenied"
    engine.destroy("r")
    assert budget_read(modal_env, ci, "dev") == "PermissionDenied"


@needs_matrix
def test_contributor_writes_in_its_environment_only(
    engine: Engine, modal_env: EmulatorProcess, ci: tuple[str, str]
) -> None:
    """The contract of the emulator's role matrix (Modal's RBAC guide): a contributor reads
    and writes in its environment (a secret here), nothing elsewhere; a viewer only reads."""
    engine.up("r", P, role())
    token_env = modal_env.subprocess_env(
        {"MODAL_TOKEN_ID": ci[0], "MODAL_TOKEN_SECRET": ci[1], "MODAL_ENVIRONMENT": "dev"}
    )
    import subprocess
    import sys

    def secret_create(env: str) -> subprocess.CompletedProcess[str]:
        code = (
            "import modal, sys; modal.Secret.objects.create('s', {'k': 'v'},"
            " environment_name=sys.argv[1]); print('ok')"
        )
        return subprocess.run(
            [sys.executable, "-c", code, env],
            env=token_env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    assert secret_create("dev").returncode == 0
    denied = secret_create("main")
    assert denied.returncode != 0 and "PermissionDenied" in denied.stderr
    engine.up("r", P, role(role_="viewer"))
    assert "PermissionDenied" in secret_create("dev").stderr


def test_only_an_owner_sets_roles(
    engine: Engine, emulator: EmulatorProcess, ci: tuple[str, str]
) -> None:
    env = server_env(emulator, MODAL_TOKEN_ID=ci[0], MODAL_TOKEN_SECRET=ci[1])
    with ProviderServer(env=env).start() as other, pytest.raises(ProviderCallError) as ei:
        Engine(other).up("r", P, role())
    assert "EnvironmentRole 'ci' as contributor in environment 'dev'" in ei.value.message
    assert "Owner or Manager" in ei.value.message and ci[1] not in ei.value.details


def test_missing_environment_or_user(
    engine: Engine, modal_env: EmulatorProcess, ci: tuple[str, str]
) -> None:
    with pytest.raises(ProviderCallError) as ei:
        engine.up("r", P, role(env="nope"))
    assert "does not exist" in ei.value.message
    engine.up("r", P, role())
    modal.Environment.objects.delete("dev")
    assert engine.refresh("r") == "update"  # its role went with the environment
    engine.destroy("r")  # revoking where the environment is gone: nothing to do


def test_check_failures(srv: ProviderServer) -> None:
    bad = srv.check(P, role("a b", "en-x", "owner", ["ok", "bad name"])).failures
    assert sorted(p for p, _ in bad) == ["environment", "role", "service_user", "service_users"]
    none = srv.check(P, role(role_="none")).failures
    assert "no role at all: declare no EnvironmentRole" in none[0][1]
