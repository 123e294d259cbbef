"""Modal's roles for service-user tokens (dev/emulator/models/rbac.py), through the real CLI/SDK.

A contributor of `dev` deploys, lists, stops and creates secrets and volumes there and nowhere
else; a viewer of `dev` reads (apps, logs, budget) and writes nothing; a service user with no
role (the CI "preview" identity) may call nothing but ClientHello; no service user manages the
workspace (environments, budgets, service users, roles, proxy tokens); the workspace token
(the Owner) still does everything. The role table covers every RPC the emulator serves.

Kept (issue 33 item 7): the access stack grants these roles (access/__main__.py,
components/modal/environment_role.py, service_user.py); modal 1.6.4 modal/cli/environment.py
`_apply_role_update`, modal/_workspace.py service users.
"""

from __future__ import annotations

import json
import subprocess
import sys
import typing
from pathlib import Path
from typing import Any

import modal
import pytest
from google.protobuf.empty_pb2 import Empty
from modal_proto import api_pb2

from emulator.errors import PermissionDenied
from emulator.handlers.base import REGISTRY
from emulator.models import State, rbac
from emulator.models.common import Creation
from emulator.models.rbac import RULES, Need
from emulator.store import Store
from tests.harness.emulator import PROJECT_ROOT, EmulatorProcess

APP_SOURCE = """
import modal

app = modal.App("rbac-demo")


@app.function()
def add_one(x: int) -> int:
    return x + 1
"""


# ---- the table ---------------------------------------------------------------------------
def test_every_registered_rpc_is_classified() -> None:
    """Deny by default stays honest: a new handler needs a rule (with its source) and a row in
    docs/emulator.md's role table."""
    import emulator.handlers  # noqa: F401  (registers every handler)

    assert sorted(set(REGISTRY) - set(RULES)) == [], "RPCs without a role rule"
    assert sorted(set(RULES) - set(REGISTRY)) == [], "rules for RPCs the emulator lacks"
    for name, rule in RULES.items():
        assert rule.source, f"{name}: no source"
        if rule.need in (Need.READ, Need.WRITE):
            assert rule.env, f"{name}: an environment rule needs fields naming it"
    doc = (PROJECT_ROOT / "docs" / "emulator.md").read_text()
    section = doc[doc.index("## Roles: what a service-user token may call") :]
    table = section[: section.index("**The request's environment.**")]
    assert sorted(n for n in REGISTRY if f"`{n}`" not in table) == [], "not in the docs' table"


class _FakeRuntime:
    """Function calls and containers, as dev/emulator/runtime/manager.py keeps them."""

    def __init__(self, call_id: str, function_id: str, task_id: str, app_id: str) -> None:
        self._call = type("Call", (), {"function_id": function_id})()
        self._container = type("Container", (), {"app_id": app_id})()
        self._ids = (call_id, task_id)
        self.calls = self

    def get(self, call_id: str) -> Any:
        return self._call if call_id == self._ids[0] else None

    def container(self, task_id: str) -> Any:
        return self._container if task_id == self._ids[1] else None


def _request_type(method: str) -> Any:
    hints = typing.get_type_hints(REGISTRY[method])
    return hints["req"]


def test_each_rpc_against_each_role_in_process() -> None:
    """Every RPC, with a request naming `dev`'s objects, for each kind of identity."""
    import emulator.handlers  # noqa: F401

    state = State(Store(None), "ws")
    dev = state.environments.create("dev")
    state.environments.create("prod")
    app = state.apps.create("dev", "demo", "initializing")
    fn = state.apps.precreate_function(app.id, "f")
    secret = state.secrets.get_or_create("s", "dev", Creation.IF_MISSING, {"A": "1"})
    volume = state.volumes.get_or_create("v", "dev", Creation.IF_MISSING)
    dict_ = state.dicts.get_or_create("d", "dev", Creation.IF_MISSING)
    runtime = _FakeRuntime("fc-" + "a" * 22, fn.id, "ta-" + "b" * 22, app.id)
    ids = {
        rbac.NAME: "dev",
        rbac.ENV_ID: dev.id,
        rbac.APP: app.id,
        rbac.FUNCTION: fn.id,
        rbac.SECRET: secret.id,
        rbac.VOLUME: volume.id,
        rbac.DICT: dict_.id,
        rbac.CALL: "fc-" + "a" * 22,
        rbac.TASK: "ta-" + "b" * 22,
    }
    users = {}
    for name, role in (("preview", None), ("viewer", "viewer"), ("contrib", "contributor")):
        users[name], _ = state.service_users.create(name, 0)
        if role:
            state.service_users.set_role(name, dev.id, role)

    def allowed(user: str, method: str, request: Any) -> bool:
        try:
            rbac.authorize(state, runtime, users[user], method, request)
        except PermissionDenied as exc:
            text = str(exc)
            assert user in text and method in text
            assert "as-" not in text  # never a secret
            return False
        return True

    for method, rule in RULES.items():
        cls = _request_type(method)
        for creating in (False, True) if rule.creating else (False,):
            req = cls()
            for field, kind in rule.env:
                setattr(req, field, ids[kind])
            if creating:
                req.object_creation_type = api_pb2.OBJECT_CREATION_TYPE_CREATE_IF_MISSING
            need = rule.creating if creating and rule.creating else rule.need
            what = f"{method} creating={creating}"
            # No role: nothing but the handshake.
            assert allowed("preview", method, req) is (method == "ClientHello"), what
            reads = need in (Need.ANYONE, Need.READ, Need.READ_SOMEWHERE)
            writes = reads or need in (Need.WRITE, Need.WRITE_SOMEWHERE)
            assert allowed("viewer", method, req) is reads, what
            assert allowed("contrib", method, req) is writes, what

    # The same requests in `prod`, where nobody has a role, are refused to all of them.
    for method in ("AppList", "AppCreate", "SecretList", "VolumeGetOrCreate", "FunctionGet"):
        req = _request_type(method)(environment_name="prod")
        for user in users:
            assert not allowed(user, method, req), (user, method)
    # An environment-less request of an environment RPC is refused, not taken as "all".
    assert not allowed("contrib", "AppGetLogs", api_pb2.AppGetLogsRequest())
    # A handler added without a rule is refused to every service user (deny by default).
    with pytest.raises(PermissionDenied, match="does not classify this RPC"):
        rbac.authorize(state, runtime, users["contrib"], "SomeNewRpc", Empty())
    # An object the emulator does not know cannot be checked: refused.
    unknown = api_pb2.AppStopRequest(app_id="ap-" + "z" * 22)
    assert not allowed("contrib", "AppStop", unknown)
    # EnvironmentList shows a service user only its environments, with its role.
    listed = api_pb2.EnvironmentListResponse(
        items=[
            api_pb2.EnvironmentListItem(name=e.name, environment_id=e.id)
            for e in state.environments.list()
        ]
    )
    rule = RULES["EnvironmentList"]
    shown = rbac.filter_answer(state, users["viewer"], rule, listed)
    assert [(i.name, i.effective_role) for i in shown.items] == [
        ("dev", api_pb2.ENVIRONMENT_ROLE_VIEWER)
    ]
    # A scoped service user is what the API creates; an unscoped one (Modal's workspace
    # Member) has no more here, since the emulator treats every environment as restricted.
    member, _ = state.service_users.create("member", 0, scoped=False)
    assert state.service_users.role_in(member, dev.id) is None
    with pytest.raises(PermissionDenied, match="Owner or Manager"):
        rbac.authorize(state, runtime, member, "EnvironmentCreate", Empty())


# ---- through the real CLI and SDK ---------------------------------------------------------
def _cli(emu: EmulatorProcess, token: Any, *commands: list[str]) -> list[dict[str, Any]]:
    """Several `modal` commands in one process (tests/emulator/cli_batch.py) as `token`."""
    env = emu.subprocess_env(
        {"MODAL_TOKEN_ID": token.token_id, "MODAL_TOKEN_SECRET": token.token_secret}
    )
    proc = subprocess.run(
        [sys.executable, "-m", "tests.emulator.cli_batch", json.dumps(list(commands))],
        env=env,
        cwd=PROJECT_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith('{"argv"')]
    assert proc.returncode == 0 and len(lines) == len(commands), (proc.stdout, proc.stderr)
    return [json.loads(line) for line in lines]


def _ok(result: dict[str, Any]) -> dict[str, Any]:
    assert result["exit_code"] == 0, result
    return result


def _denied(result: dict[str, Any], *words: str) -> str:
    assert result["exit_code"] != 0, result
    assert result["error_type"] == "PermissionDeniedError", result
    for word in words:
        assert word in result["error"], (word, result["error"])
    return str(result["error"])


def _raw(token: Any, method: str, request: Any) -> Any:
    """One RPC with a service user's token (modal.Client.from_credentials)."""
    from modal._utils.async_utils import synchronizer
    from modal.client import _Client

    async def call() -> Any:
        client = await _Client.from_credentials(token.token_id, token.token_secret)
        try:
            return await getattr(client._stub, method)(request)
        finally:
            await client.close()

    return synchronizer.create_blocking(call)()


@pytest.fixture
def setup(modal_env: EmulatorProcess, tmp_path: Path) -> dict[str, Any]:
    """`dev` and `prod`, an app file, and three service users made by the workspace token."""
    modal.Environment.objects.create("dev")
    modal.Environment.objects.create("prod")
    app_file = tmp_path / "rbac_demo.py"
    app_file.write_text(APP_SOURCE)
    users = modal.Workspace.from_context().service_users
    tokens = {name: users.create(name, expires_in=None) for name in ("ci-dev", "ro-dev", "preview")}
    users.set_role("ci-dev", "dev", role="contributor")
    users.set_role("ro-dev", "dev", role="viewer")
    return {"emu": modal_env, "app": str(app_file), **tokens}


def test_a_contributor_of_dev_deploys_and_manages_dev_only(setup: dict[str, Any]) -> None:
    emu, app, ci = setup["emu"], setup["app"], setup["ci-dev"]
    deploy, listed, secret, volume, stop, prod, *admin = _cli(
        emu,
        ci,
        ["deploy", "-e", "dev", app],
        ["app", "list", "-e", "dev", "--json"],
        ["secret", "create", "-e", "dev", "ci-secret", "A=1"],
        ["volume", "create", "-e", "dev", "ci-volume"],
        ["app", "stop", "-e", "dev", "rbac-demo", "-y"],
        ["deploy", "-e", "prod", app],
        ["environment", "create", "ci-made"],
        ["workspace", "service-users", "create", "ci-made"],
        ["workspace", "proxy-tokens", "create", "--name", "ci-made"],
    )
    assert "App deployed" in _ok(deploy)["stdout"]
    assert [a["description"] for a in json.loads(_ok(listed)["stdout"])] == ["rbac-demo"]
    _ok(secret), _ok(volume), _ok(stop)
    state = emu.state()
    assert [s["name"] for s in state["secrets"]] == ["ci-secret"]
    assert [v["name"] for v in state["volumes"]] == ["ci-volume"]
    assert [a["state"] for a in state["apps"]] == ["stopped"]
    message = _denied(prod, "'ci-dev'", "'prod'", "role: none", "contributor")
    assert "modal workspace service-users set-role ci-dev prod" in message
    assert ci.token_secret not in message
    for result in admin:
        _denied(result, "'ci-dev'", "Owner or Manager")
    assert [e["name"] for e in emu.state()["environments"]] == ["main", "dev", "prod"]
    # Budgets and roles are workspace management too.
    env_ids = {e["name"]: e["id"] for e in emu.state()["environments"]}
    with pytest.raises(modal.exception.PermissionDeniedError, match="EnvironmentSetBudget"):
        _raw(
            ci,
            "EnvironmentSetBudget",
            api_pb2.EnvironmentSetBudgetRequest(
                environment_id=env_ids["dev"], cycle_budget_dollars=1.0
            ),
        )
    with pytest.raises(modal.exception.PermissionDeniedError, match="EnvironmentRoleSet"):
        _raw(
            ci,
            "EnvironmentRoleSet",
            api_pb2.EnvironmentRoleSetRequest(
                service_user_name="ci-dev", environment_id=env_ids["prod"], role_str="contributor"
            ),
        )
    # Its environment list holds only dev.
    listed_envs = _raw(ci, "EnvironmentList", Empty())
    assert [i.name for i in listed_envs.items] == ["dev"]


def test_a_viewer_of_dev_reads_and_writes_nothing(setup: dict[str, Any]) -> None:
    emu, app, ro = setup["emu"], setup["app"], setup["ro-dev"]
    _ok(_cli(emu, setup["ci-dev"], ["deploy", "-e", "dev", app])[0])
    emu.set_usage("dev", 4.5)
    listed, logs, history, deploy, secret, stop = _cli(
        emu,
        ro,
        ["app", "list", "-e", "dev", "--json"],
        ["app", "logs", "-e", "dev", "rbac-demo"],
        ["app", "history", "-e", "dev", "rbac-demo"],
        ["deploy", "-e", "dev", app],
        ["secret", "create", "-e", "dev", "ro-secret", "A=1"],
        ["app", "stop", "-e", "dev", "rbac-demo", "-y"],
    )
    assert [a["description"] for a in json.loads(_ok(listed)["stdout"])] == ["rbac-demo"]
    _ok(logs), _ok(history)
    for result in (deploy, secret, stop):
        _denied(result, "'ro-dev'", "'dev'", "role: viewer", "needs contributor")
        assert "set-role ro-dev dev contributor" in result["error"]
    state = emu.state()
    assert state["secrets"] == [] and [a["state"] for a in state["apps"]] == ["deployed"]
    dev_id = next(e["id"] for e in state["environments"] if e["name"] == "dev")
    budget = _raw(
        ro, "EnvironmentGetBudget", api_pb2.EnvironmentGetBudgetRequest(environment_id=dev_id)
    )
    assert budget.current_cycle_usage == 4.5


def test_a_service_user_with_no_role_may_call_nothing_but_client_hello(
    setup: dict[str, Any],
) -> None:
    emu, app, preview = setup["emu"], setup["app"], setup["preview"]
    results = _cli(
        emu,
        preview,
        ["deploy", "-e", "dev", app],
        ["deploy", app],  # the default environment, main
        ["app", "list", "-e", "dev"],
        ["environment", "list"],
        ["secret", "list"],
    )
    for result in results:
        _denied(result, "'preview'")
    assert "has no access to environment 'dev' (role: none)" in results[0]["error"]
    assert "has no access to environment 'main'" in results[1]["error"]
    assert emu.state()["apps"] == []
    _raw(preview, "ClientHello", Empty())
    for method, request in (
        ("WorkspaceNameLookup", Empty()),
        ("BlobCreate", api_pb2.BlobCreateRequest(content_length=1)),
    ):
        with pytest.raises(modal.exception.PermissionDeniedError, match="no such role anywhere"):
            _raw(preview, method, request)


def test_the_workspace_token_is_the_owner(setup: dict[str, Any]) -> None:
    """Everything a service user is refused, the workspace token does."""
    emu = setup["emu"]
    from tests.emulator.helpers import raw_rpc

    modal.Environment.objects.create("owner-made")
    env_ids = {e["name"]: e["id"] for e in emu.state()["environments"]}
    raw_rpc(
        "EnvironmentSetBudget",
        api_pb2.EnvironmentSetBudgetRequest(
            environment_id=env_ids["prod"], cycle_budget_dollars=5.0
        ),
    )
    token = modal.Workspace.from_context().proxy_tokens.create("owner-token")
    assert token.token_id.startswith("wk-")
    users = modal.Workspace.from_context().service_users
    users.set_role("preview", "prod", role="viewer")
    assert users.info("preview").environment_roles == {"prod": "viewer"}
    assert [u.name for u in users.list()] == ["ci-dev", "ro-dev", "preview"]
